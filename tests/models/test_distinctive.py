"""A persona's most distinctive answers: exact lifts on a hand-enumerable mixture."""

from __future__ import annotations

import math

import pytest
import torch

from models import DTYPE, ItemBank, PersonaMixture, ShapeError
from models.distinctive import DistinctiveAnswer, distinctive_answers

# three classes with weights 1/2, 1/4, 1/4; item 0 has three options, item 1 two
WEIGHTS = [0.5, 0.25, 0.25]
MU = [
    [[0.8, 0.1, 0.1], [0.5, 0.5, 0.0]],
    [[0.2, 0.6, 0.2], [0.9, 0.1, 0.0]],
    [[0.2, 0.2, 0.6], [0.1, 0.9, 0.0]],
]
# overall shares by hand: item 0 [0.5, 0.25, 0.25], item 1 [0.5, 0.5]


def _args() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(MU, dtype=DTYPE), torch.log(torch.tensor(WEIGHTS, dtype=DTYPE))


def _close(got: list[DistinctiveAnswer], want: list[tuple[int, int, float, float]]) -> None:
    assert [(a.item, a.option) for a in got] == [(i, o) for i, o, _, _ in want]
    for a, (_, _, share, overall) in zip(got, want, strict=True):
        assert math.isclose(a.share, share) and math.isclose(a.overall, overall)
        assert math.isclose(a.lift, share / overall)


def test_lifts_by_hand() -> None:
    mu, log_prior = _args()
    c0, c1, c2 = distinctive_answers(mu, log_prior, [0, 1, 2])
    # class 0: 0.8 vs 0.5 on item 0; item 1's 0.5 vs 0.5 is no lift
    _close(c0, [(0, 0, 0.8, 0.5)])
    # classes 1 and 2: 0.6 vs 0.25 (lift 2.4) before 0.9 vs 0.5 (lift 1.8)
    _close(c1, [(0, 1, 0.6, 0.25), (1, 0, 0.9, 0.5)])
    _close(c2, [(0, 2, 0.6, 0.25), (1, 1, 0.9, 0.5)])


def test_top_min_share_and_items_restrict_the_choice() -> None:
    mu, log_prior = _args()
    assert [(a.item, a.option) for a in distinctive_answers(mu, log_prior, [1], top=1)[0]] == [
        (0, 1)
    ]
    # 0.6 is below a 0.7 floor: only the 0.9 answer is left
    _close(distinctive_answers(mu, log_prior, [1], min_share=0.7)[0], [(1, 0, 0.9, 0.5)])
    _close(distinctive_answers(mu, log_prior, [2], items=[1])[0], [(1, 1, 0.9, 0.5)])
    assert distinctive_answers(mu, log_prior, [0], items=[1]) == [[]]


def test_overall_share_is_the_models_prior_predictive() -> None:
    mu, log_prior = _args()
    model = PersonaMixture(ItemBank(("a", "b"), (3, 2)), mu, log_prior)
    prior = model.predict(model.initial_state({}), [0, 1])
    for c, answers in enumerate(distinctive_answers(mu, log_prior, [0, 1, 2], min_share=0.0)):
        for a in answers:
            assert math.isclose(a.overall, float(prior[a.item, a.option]))
            assert math.isclose(a.share, MU[c][a.item][a.option])


def test_bad_shapes_are_refused() -> None:
    mu, log_prior = _args()
    with pytest.raises(ShapeError, match="class index 3"):
        distinctive_answers(mu, log_prior, [3])
    with pytest.raises(ShapeError, match="log_prior"):
        distinctive_answers(mu, log_prior[:2], [0])
    with pytest.raises(ShapeError, match="item index 2"):
        distinctive_answers(mu, log_prior, [0], items=[2])
