"""Preference profiles built from a belief model's predictive distributions."""

from __future__ import annotations

import pytest
import torch

from models.base import DTYPE, ItemBank, ModelError
from models.cape_factor import CapeFactor, sobol_normal
from models.cape_profile import ItemText, preference_profile


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
    prof = preference_profile(model, state, texts, observed=[2])
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
    prof = preference_profile(model, state, texts, observed=[2], include_observed=False)
    assert [e.key for e in prof.items] == ["news"]
    with pytest.raises(ModelError, match="3 item texts for 4 items"):
        preference_profile(model, state, texts[:3])
    wrong = [*texts[:3], ItemText("news", "News", ("TV", "Web"))]
    with pytest.raises(ModelError, match="'news', 2 options"):
        preference_profile(model, state, wrong)
