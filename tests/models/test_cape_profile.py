"""Preference profiles built from a belief model's predictive distributions."""

from __future__ import annotations

import pytest
import torch

from models.base import DTYPE, ItemBank, ModelError
from models.cape_factor import CapeFactor, sobol_normal
from models.cape_profile import ItemText, preference_profile
from models.persona import PersonaMixture


def _model() -> tuple[CapeFactor, list[ItemText]]:
    gen = torch.Generator().manual_seed(3)
    bank = ItemBank(("care_examples", "care_short", "vote", "news"), (5, 5, 2, 3))
    w = torch.randn(4, 5, 1, generator=gen, dtype=DTYPE)
    b = torch.randn(4, 5, generator=gen, dtype=DTYPE)
    texts = [
        ItemText("care_examples", "Worked examples", tuple("12345"), ordinal=True, criterion=True),
        ItemText("care_short", "Short answers", tuple("12345"), ordinal=True, criterion=True),
        ItemText("vote", "Did you vote?", ("Yes", "<b>No</b>")),
        ItemText("news", "News source", ("TV", "Web", "Paper")),
    ]
    return CapeFactor(bank, w, b, sobol_normal(256, 1, seed=0)), texts


def test_profile_ranks_criteria_by_expected_level_and_items_by_probability() -> None:
    model, texts = _model()
    state = model.replay([(2, 1)])
    prof = preference_profile(model, state, texts, observed={2: 1})
    pred = model.predict(state)
    assert [e.key for e in prof.criteria] == sorted(
        ["care_examples", "care_short"],
        key=lambda k: (
            -float((torch.arange(1, 6, dtype=DTYPE) * pred[model.item_bank.index(k), :5]).sum())
        ),
    )
    for e in prof.criteria:
        i = model.item_bank.index(e.key)
        want = float((torch.arange(1, 6, dtype=DTYPE) * pred[i, :5]).sum())
        assert e.expected_level == pytest.approx(want)
        assert e.probability == pytest.approx(float(pred[i, :5].max()))
    probs = [e.probability for e in prof.items]
    assert probs == sorted(probs, reverse=True)
    vote = next(e for e in prof.items if e.key == "vote")
    assert vote.observed and vote.option == "<b>No</b>" and vote.probability == 1.0
    assert vote.expected_level is None  # not ordinal
    # the summary names the labels verbatim (escaping is the renderer's job)
    assert "Worked examples" in prof.summary and "<b>No</b> (answered)" in prof.summary
    d = prof.to_dict()
    assert set(d) == {"criteria", "items", "summary"} and len(d["items"]) == 2


def test_profile_without_observed_items_and_bad_texts() -> None:
    model, texts = _model()
    state = model.replay([(2, 0)])
    prof = preference_profile(model, state, texts, observed={2: 0}, include_observed=False)
    assert [e.key for e in prof.items] == ["news"]
    with pytest.raises(ModelError, match="3 item texts for 4 items"):
        preference_profile(model, state, texts[:3])
    wrong = [*texts[:3], ItemText("news", "News", ("TV", "Web"))]
    with pytest.raises(ModelError, match="'news', 2 options"):
        preference_profile(model, state, wrong)


def test_an_answered_item_shows_the_answer_whatever_the_model_predicts() -> None:
    # two latent classes; after answering "vote" = No (1) the posterior predictive of
    # "vote" is a mixture over the classes (Yes stays the more likely option), but the
    # profile reports the answer itself with probability 1
    bank = ItemBank(("vote", "news"), (2, 3))
    mu = torch.tensor(
        [[[0.9, 0.1, 0.0], [0.6, 0.3, 0.1]], [[0.6, 0.4, 0.0], [0.2, 0.3, 0.5]]], dtype=DTYPE
    )
    model = PersonaMixture(bank, mu, torch.log(torch.tensor([0.5, 0.5], dtype=DTYPE)))
    state = model.replay([(0, 1)])
    assert float(model.predict(state)[0, 0]) > 0.5  # the model's own predictive says Yes
    texts = [
        ItemText("vote", "Did you vote?", ("Yes", "No")),
        ItemText("news", "News", ("TV", "Web", "Paper")),
    ]
    prof = preference_profile(model, state, texts, observed={0: 1})
    vote = next(e for e in prof.items if e.key == "vote")
    assert (vote.option, vote.option_index, vote.probability, vote.observed) == ("No", 1, 1.0, True)
    assert vote.distribution == (0.0, 1.0)
    assert "Did you vote? No (answered)" in prof.summary
    news = next(e for e in prof.items if e.key == "news")
    assert not news.observed and news.distribution == pytest.approx(
        tuple(float(v) for v in model.predict(state)[1])
    )
    with pytest.raises(ModelError, match="observed answer 2 of item 0"):
        preference_profile(model, state, texts, observed={0: 2})
