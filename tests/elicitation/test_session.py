"""The session transition: decisions, skips, stopping, replay."""

from __future__ import annotations

import pytest
import torch

from elicitation.budget import Budget, StopReason
from elicitation.criteria import get_criterion
from elicitation.errors import SessionError
from elicitation.session import decide, replay_state
from tests.support.elicitation_cases import informative_mixture, random_mixture

CANDS = [3, 1, 0, 2]


def test_decision_picks_informative_item_and_explains() -> None:
    model = informative_mixture()
    d = decide(
        model,
        model.initial_state(),
        asked=[],
        candidates=CANDS,
        targets=[4],
        criterion=get_criterion("eig"),
        budget=Budget(3),
    )
    assert d.item == 0 and d.stop_reason is None
    assert set(d.scores) == set(CANDS)
    assert d.best_gain == pytest.approx(d.scores[0])
    assert d.target_entropy == pytest.approx(torch.log(torch.tensor(2.0)).item())
    assert d.expected_target_entropy == pytest.approx(d.target_entropy - d.scores[0])
    out = d.to_dict(model.item_bank.keys)
    assert out["item"] == "informative" and out["criterion"] == "eig"
    assert set(out["scores"]) == {"informative", "noise_a", "noise_b", "noise_c"}


def test_skipped_item_is_never_asked_again_and_changes_nothing() -> None:
    model = informative_mixture()
    crit = get_criterion("eig")
    state = replay_state(model, None, [(0, None)])  # skipped the informative item
    assert torch.equal(state.log_post, model.initial_state().log_post)
    d = decide(
        model,
        state,
        asked=[],
        skipped=[0],
        candidates=CANDS,
        targets=[4],
        criterion=crit,
        budget=Budget(3),
    )
    assert d.item is not None and d.item != 0
    assert 0 not in d.scores
    # a skip counts as a posed question against the maximum
    d = decide(
        model,
        state,
        asked=[1],
        skipped=[0],
        candidates=CANDS,
        targets=[4],
        criterion=crit,
        budget=Budget(2),
    )
    assert d.item is None and d.stop_reason is StopReason.MAX_QUESTIONS
    # everything asked or skipped: no candidates left
    d = decide(
        model,
        state,
        asked=[1, 2],
        skipped=[0, 3],
        candidates=CANDS,
        targets=[4],
        criterion=crit,
        budget=Budget(None),
    )
    assert d.stop_reason is StopReason.NO_CANDIDATES


def test_gain_and_entropy_thresholds_with_min_questions() -> None:
    model = informative_mixture()
    after = model.update(model.initial_state(), 0, 1)  # the target is now nearly known
    for crit_name in ("eig", "random"):  # random: the gain is computed for the rule
        crit = get_criterion(crit_name)
        kw = {"candidates": CANDS, "targets": [4], "criterion": crit}
        d = decide(model, after, asked=[0], budget=Budget(10, stop_eig_threshold=1e-6), **kw)
        assert d.stop_reason is StopReason.LOW_GAIN and d.best_gain is not None
        d = decide(
            model,
            after,
            asked=[0],
            budget=Budget(10, min_questions=2, stop_eig_threshold=1e-6),
            **kw,
        )
        assert d.item is not None
        d = decide(model, after, asked=[0], budget=Budget(10, stop_entropy_threshold=0.1), **kw)
        assert d.stop_reason is StopReason.LOW_ENTROPY
        # at the start, the informative item has a large gain: no early stop
        d = decide(
            model, model.initial_state(), asked=[], budget=Budget(10, stop_eig_threshold=0.1), **kw
        )
        assert d.item is not None


def test_session_loop_respects_max_and_replay_equals_incremental() -> None:
    model = random_mixture((2, 3, 4, 2, 3, 2, 3, 2), k=6, seed=11)
    gen = torch.Generator().manual_seed(0)
    attrs = {0: 1}
    cands, targets = [1, 2, 3, 4, 5], [6, 7]
    state = model.initial_state(attrs)
    asked: list[int] = []
    skipped: list[int] = []
    log: list[tuple[int, int | None]] = []
    budget = Budget(max_questions=4)
    crit = get_criterion("eig")
    while True:
        d = decide(
            model,
            state,
            asked=asked,
            skipped=skipped,
            candidates=cands,
            targets=targets,
            criterion=crit,
            budget=budget,
        )
        if d.item is None:
            break
        assert d.item not in asked and d.item not in skipped and d.item in cands
        if len(log) == 1:  # the second question is skipped
            skipped.append(d.item)
            log.append((d.item, None))
            continue
        opt = int(torch.randint(model.item_bank.n_options[d.item], (1,), generator=gen))
        state = model.update(state, d.item, opt)
        asked.append(d.item)
        log.append((d.item, opt))
    assert d.stop_reason is StopReason.MAX_QUESTIONS and len(log) == 4
    replayed = replay_state(model, attrs, log)
    torch.testing.assert_close(replayed.log_post, state.log_post, rtol=0, atol=1e-14)
    assert replayed.observed == state.observed


def test_session_errors() -> None:
    model = informative_mixture()
    s = model.initial_state()
    crit = get_criterion("eig")
    with pytest.raises(SessionError, match="both answered and skipped"):
        decide(
            model,
            s,
            asked=[1],
            skipped=[1],
            candidates=CANDS,
            targets=[4],
            criterion=crit,
            budget=Budget(),
        )
    with pytest.raises(SessionError, match="candidates: unknown item index 9"):
        decide(model, s, asked=[], candidates=[9], targets=[4], criterion=crit, budget=Budget())
    with pytest.raises(SessionError, match="both candidates and targets"):
        decide(model, s, asked=[], candidates=[0, 4], targets=[4], criterion=crit, budget=Budget())
    with pytest.raises(SessionError, match="need at least one target"):
        decide(
            model,
            s,
            asked=[],
            candidates=CANDS,
            targets=[],
            criterion=get_criterion("random"),
            budget=Budget(stop_entropy_threshold=0.1),
        )
    with pytest.raises(SessionError, match="twice"):
        replay_state(model, None, [(0, 1), (0, None)])
