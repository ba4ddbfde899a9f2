"""Selection criteria: which question to ask next.

A criterion scores candidate items for a respondent whose belief state is ``state``
under a fitted :class:`models.base.BeliefModel`; a higher score is better. Criteria
never know the model family: they only call the interface of ``models.base``
(``predict``, ``lookahead``, the batched forms) and, where a criterion needs more, an
optional capability that it names in a clear error when the model lacks it
(``latent_posterior`` for ``posterior_entropy``; ``theta_posterior`` for ``irt``).

Notation: ``h`` the answers so far, ``x`` a candidate, ``I*`` the target items,
``H(p) = -sum_j p_j log p_j`` (nats, ``0 log 0 = 0``).

The family (one abstract base, one class per criterion, a registry from names to
classes) follows the layout of BoTorch's ``acquisition`` package.

References:
    Adaptive Querying with AI Persona Priors (arXiv 2605.00696), Algorithms 1 and 2;
    see ``METHODS.md`` section 1.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from elicitation.errors import CriterionNotApplicableError, ElicitationError, UnknownCriterionError
from models.base import DTYPE, MISSING, BeliefModel

ItemList = Sequence[int] | Tensor


def _as_items(items: ItemList) -> list[int]:
    return [int(i) for i in torch.as_tensor(items, dtype=torch.long).reshape(-1).tolist()]


def entropy(p: Tensor, dim: int = -1) -> Tensor:
    """Shannon entropy in nats along ``dim``: ``H(p) = -sum_j p_j log p_j`` with ``0 log 0 = 0``.

    Args:
        p: probabilities ``[..., O, ...]`` (zeros allowed, e.g. padding beyond ``O_i``).
        dim: the option dimension.

    Returns:
        ``p`` with ``dim`` removed.
    """
    return -torch.special.xlogy(p, p).sum(dim)


def expected_target_entropy(p_x: Tensor, p_t: Tensor) -> Tensor:
    """Expected mean target entropy after answering each candidate (METHODS.md section 1).

    ``E(x) = sum_k p(Y_x = k | h) * (1/|I*|) sum_{t in I*} H(p(Y_t | h, Y_x = k))``.

    Args:
        p_x: ``[..., C, O]`` candidate predictives (zero beyond ``O_x``).
        p_t: ``[..., C, O, T, O]`` target predictives after each candidate answer.

    Returns:
        ``[..., C]``.
    """
    h = entropy(p_t).mean(-1)  # [..., C, O]
    return (p_x * h).sum(-1)


def mean_target_entropy(p_targets: Tensor) -> Tensor:
    """``(1/|I*|) sum_t H(p(Y_t | h))`` for predictives ``[..., T, O]``; returns ``[...]``."""
    return entropy(p_targets).mean(-1)


def _check_targets(name: str, targets: list[int]) -> None:
    if not targets:
        raise CriterionNotApplicableError(
            f"criterion {name!r} needs at least one target item (none were given)"
        )


class SelectionCriterion(ABC):
    """Scores candidate items; the selected item is the one with the highest score.

    Subclasses set ``name`` (the registry key) and implement :meth:`score` (one
    respondent) and :meth:`score_batch` (``B`` respondents sharing candidates and targets).

    Attributes:
        name: registry name.
        scores_are_target_gains: true when a score is the expected information gain about
            the targets (nats), so a stopping rule on the expected gain can use it directly.
        adaptive: false for a criterion whose order ignores the respondent's answers.
        uses_fixed_order: true for a criterion that needs the non-adaptive
            :class:`FixedOrder` list of the pool (``fixed``, ``eig_anchored``): the list
            is expensive (a greedy search under the prior), so a live study computes it
            once per fitted model, pool and targets and hands it over with
            ``set_fixed_order`` instead of letting :meth:`prepare` compute it.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    scores_are_target_gains: ClassVar[bool] = False
    adaptive: ClassVar[bool] = True
    uses_fixed_order: ClassVar[bool] = False

    def prepare(self, model: BeliefModel, pool: ItemList, targets: ItemList) -> None:
        """Precompute what does not depend on the respondent (default: nothing).

        Called with the full candidate pool of a study (or a benchmark run) before any
        respondent is scored, so that a non-adaptive order is computed once, on the pool,
        and not re-derived from whatever candidates remain later.
        """
        return None

    @abstractmethod
    def score(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        """Scores ``[C]`` (float64) for ``candidates`` of one respondent; higher is better."""

    @abstractmethod
    def score_batch(
        self, model: BeliefModel, states: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        """Scores ``[B, C]`` for a batch state of ``B`` respondents."""

    def score_with_gains(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> tuple[Tensor, Tensor | None]:
        """``(scores [C], one-step target gains [C] or None)`` for one respondent.

        The gains are the ``eig`` scores when the criterion computed them anyway (so a
        stopping rule on the expected gain needs no second lookahead); ``None`` otherwise.
        """
        scores = self.score(model, state, candidates, targets)
        return scores, (scores if self.scores_are_target_gains else None)

    def params(self) -> dict[str, Any]:
        """The constructor parameters (for :meth:`explain` and for storing a decision)."""
        return {}

    def explain(self) -> dict[str, Any]:
        """A JSON-able description: name, what the score means, and parameters."""
        return {"name": self.name, "description": self.description, "params": self.params()}


_CRITERIA: dict[str, type[SelectionCriterion]] = {}


def register_criterion(cls: type[SelectionCriterion]) -> type[SelectionCriterion]:
    """Class decorator: make ``cls`` available to :func:`get_criterion` under ``cls.name``."""
    if not cls.name:
        raise ElicitationError(f"{cls.__name__} has no criterion name")
    _CRITERIA[cls.name] = cls
    return cls


def criterion_names() -> list[str]:
    """The registered criterion names, sorted."""
    return sorted(_CRITERIA)


def get_criterion(name: str, **kwargs: Any) -> SelectionCriterion:
    """A new criterion of the registered class ``name`` built with ``kwargs``.

    Raises:
        UnknownCriterionError: ``name`` is not registered (the message lists the known ones).
        ElicitationError: a keyword the criterion does not take.
    """
    try:
        cls = _CRITERIA[name]
    except KeyError:
        raise UnknownCriterionError(
            f"unknown selection criterion {name!r} (known: {', '.join(criterion_names())})"
        ) from None
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ElicitationError(
            f"criterion {name!r}: bad parameters {sorted(kwargs)}: {exc}"
        ) from None


# --------------------------------------------------------------------------------------
@register_criterion
class ExpectedInformationGain(SelectionCriterion):
    """Expected information gain about the targets (greedy one-step lookahead).

    ``EIG(x) = (1/|I*|) sum_t H(p(Y_t | h)) - sum_k p(Y_x = k | h) (1/|I*|) sum_t H(p(Y_t | h, Y_x = k))``

    i.e. the current mean target entropy minus the expected mean target entropy after
    the answer to ``x`` (METHODS.md section 1, "Algorithm 2"; the subtraction of a
    constant does not change the argmax but makes the score a gain in nats, >= 0 for a
    coherent Bayesian model, usable by a stopping threshold). Computed from
    ``model.lookahead`` / ``model.lookahead_batch``, or for one respondent from
    ``model.target_entropy_lookahead(state, candidates, targets) -> (H_now, E [C])`` when
    the model has it (the same two quantities without materialising ``p_t``; see
    :meth:`models.persona.PersonaMixture.target_entropy_lookahead`).
    """

    name = "eig"
    description = "expected reduction of the mean target predictive entropy (nats)"
    scores_are_target_gains = True

    def score(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        cand, tgt = _as_items(candidates), _as_items(targets)
        _check_targets(self.name, tgt)
        if not cand:
            return torch.zeros(0, dtype=DTYPE)
        compact = getattr(model, "target_entropy_lookahead", None)
        if compact is not None:  # the same numbers without the [C, O, T, O] padding
            now, expected = compact(state, cand, tgt)
            return (now - expected).to(DTYPE)
        p_x, p_t = model.lookahead(state, cand, tgt)
        now = mean_target_entropy(model.predict(state, tgt))
        return (now - expected_target_entropy(p_x, p_t)).to(DTYPE)

    def score_batch(
        self, model: BeliefModel, states: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        cand, tgt = _as_items(candidates), _as_items(targets)
        _check_targets(self.name, tgt)
        p_x, p_t = model.lookahead_batch(states, cand, tgt)  # [B, C, O], [B, C, O, T, O]
        now = mean_target_entropy(model.predict_batch(states, tgt))  # [B]
        return (now.unsqueeze(-1) - expected_target_entropy(p_x, p_t)).to(DTYPE)


# --------------------------------------------------------------------------------------
def _selection_state(
    model: BeliefModel, state: Any, tau: float, prior_weight: float, anchor: str = "uniform"
) -> Any:
    """The state a robust criterion *selects* with (predictions keep the exact posterior).

    With ``π(θ | h)`` the posterior over personas, ``π(θ)`` the model's population prior,
    ``τ`` = ``tau`` and ``w`` = ``prior_weight``:

    ``π_τ(θ) ∝ π(θ | h)^τ`` (``anchor = "uniform"``: the posterior flattened towards
    the uniform distribution over personas) or ``π_τ(θ) ∝ π(θ | h)^τ π(θ)^(1-τ)
    = π(θ) L(h | θ)^τ`` (``anchor = "prior"``: the power posterior, between the prior at
    ``τ = 0`` and the posterior at ``τ = 1``), then ``π_sel = (1 - w) π_τ + w π(θ)``.

    A less confident belief about who the respondent is. Needs a state with a normalised
    ``log_post`` (``[K]`` or ``[B, K]``) and, for ``w > 0`` or the prior anchor, a model
    with ``log_prior [K]``.
    """
    if tau == 1.0 and prior_weight == 0.0:
        return state
    log_post = getattr(state, "log_post", None)
    log_prior = getattr(model, "log_prior", None)
    need_prior = prior_weight > 0 or anchor == "prior"
    if not isinstance(log_post, Tensor) or (need_prior and not isinstance(log_prior, Tensor)):
        raise CriterionNotApplicableError(
            f"a tempered criterion needs a state with a persona posterior 'log_post' and a "
            f"model with 'log_prior'; {type(model).__name__} (family {model.family!r}) has none"
        )
    lp = log_post * tau
    if anchor == "prior":
        lp = lp + (1 - tau) * log_prior
    lp = lp - torch.logsumexp(lp, dim=-1, keepdim=True)
    if prior_weight > 0:
        lp = torch.logaddexp(lp + math.log1p(-prior_weight), log_prior + math.log(prior_weight))
        lp = lp - torch.logsumexp(lp, dim=-1, keepdim=True)
    return dataclasses.replace(state, log_post=lp)


DEFAULT_TAU = 0.5
"""Default power of :class:`TemperedInformationGain` (the benchmark method
``eig_tempered``): chosen by 5-fold cross-validation over the training and validation
users of the shipped datasets, one value for every dataset; the runner-up rule of
docs/benchmarks.md, "Selection rule of `default`"."""


@register_criterion
class TemperedInformationGain(ExpectedInformationGain):
    """``eig`` computed under a less confident belief (selection only).

    ``score(x) = EIG(x)`` of :class:`ExpectedInformationGain` with the persona posterior
    replaced by ``π_sel`` (see :func:`_selection_state`: posterior to the power ``tau``,
    mixed with the population prior with weight ``prior_weight``). The respondent's state
    and every prediction stay exact Bayes; only the choice of the next question hedges
    against a posterior that is overconfident because the model is misspecified (a
    finite mixture of independent categoricals; respondents from another population than
    the training users). ``tau = 1, prior_weight = 0`` is ``eig`` exactly. The score is
    a gain in nats under ``π_sel``, not under the posterior, so it is not used by the
    expected-gain stopping rule.
    """

    name = "eig_tempered"
    description = "expected target-entropy reduction under a flattened posterior (selection only)"
    scores_are_target_gains = False

    def __init__(
        self, tau: float = DEFAULT_TAU, prior_weight: float = 0.0, anchor: str = "uniform"
    ) -> None:
        if not 0 < tau <= 1:
            raise ElicitationError(f"criterion {self.name!r}: tau must be in (0, 1]")
        if not 0 <= prior_weight < 1:
            raise ElicitationError(f"criterion {self.name!r}: prior_weight must be in [0, 1)")
        if anchor not in ("uniform", "prior"):
            raise ElicitationError(
                f"criterion {self.name!r}: anchor must be 'uniform' or 'prior', got {anchor!r}"
            )
        self.tau = float(tau)
        self.prior_weight = float(prior_weight)
        self.anchor = anchor

    def params(self) -> dict[str, Any]:
        return {"tau": self.tau, "prior_weight": self.prior_weight, "anchor": self.anchor}

    def score(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        sel = _selection_state(model, state, self.tau, self.prior_weight, self.anchor)
        return super().score(model, sel, candidates, targets)

    def score_batch(
        self, model: BeliefModel, states: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        sel = _selection_state(model, states, self.tau, self.prior_weight, self.anchor)
        return super().score_batch(model, sel, candidates, targets)


# --------------------------------------------------------------------------------------
@register_criterion
class TwoStepInformationGain(SelectionCriterion):
    """Expected information gain about the targets over the next two questions.

    The greedy ``eig`` rule values a question only by what its own answer tells; a
    question whose answer mostly helps to choose a good *next* question is undervalued.
    This rule looks one question further for the most promising candidates. With
    ``E(x | h) = sum_k p(Y_x = k | h) (1/|I*|) sum_t H(p(Y_t | h, Y_x = k))`` the expected
    mean target entropy after ``x`` (what ``eig`` minimises) and ``H_now`` the current one:

    ``G1(x) = H_now - E(x | h)`` (the ``eig`` score),
    ``G2(x) = H_now - sum_k p(Y_x = k | h) min_{x' in F, x' != x} E(x' | h, Y_x = k)``
    (asking ``x`` and then the best follow-up), and

    ``score(x) = (G1(x) + G2(x)) / 2``

    the mean entropy reduction over the next two questions: a session can stop after
    either, and the targets are predicted after every answer, so both count (with ``G2``
    alone, an uninformative question followed by an informative one would tie with the
    reverse order). The follow-up is searched in ``F``, the ``follow_k`` askable candidates
    with the highest ``G1`` now; ``score`` is computed for the ``top_k`` candidates with the
    highest ``G1``, the others score ``G1``. Another answer never increases the expected
    entropy, so ``G2(x) >= G1(x)`` and a top candidate's score is at least the ``G1`` of
    every other candidate: the pick is always one of the top candidates (ties to the
    earlier candidate). With ``top_k = 1`` the pick is ``eig``'s.

    A candidate without a follow-up (the last one left) scores ``G1``. The one-step gains
    are returned by :meth:`score_with_gains` for the stopping rules. Needs the batched
    lookahead and ``model.branch_batch`` (hypothetical next answers; persona mixtures and
    latent classes have it) and, for one respondent, ``model.to_batch``.

    Cost: one lookahead over all candidates plus one over ``F`` for each of the
    ``sum_{top x} O_x`` hypothetical answers.
    """

    name = "eig2"
    description = (
        "mean expected reduction of the mean target entropy over the next two questions "
        "(the question, then the best follow-up; nats)"
    )
    # Scores of the top candidates are two-question gains, not one-step gains.
    scores_are_target_gains = False

    def __init__(
        self,
        top_k: int = 3,
        follow_k: int = 8,
        chunk_rows: int = 256,
        first_weight: float = 0.5,
        follow_up: str = "adaptive",
    ) -> None:
        if top_k < 1 or follow_k < 2 or chunk_rows < 1:
            raise ElicitationError(
                f"criterion {self.name!r}: top_k and chunk_rows must be >= 1, follow_k >= 2"
            )
        self.top_k = int(top_k)
        self.follow_k = int(follow_k)
        self.chunk_rows = int(chunk_rows)
        if not 0 <= first_weight <= 1:
            raise ElicitationError(f"criterion {self.name!r}: first_weight must be in [0, 1]")
        self.first_weight = float(first_weight)
        if follow_up not in ("adaptive", "fixed"):
            raise ElicitationError(
                f"criterion {self.name!r}: follow_up must be 'adaptive' or 'fixed', got {follow_up!r}"
            )
        self.follow_up = follow_up

    def params(self) -> dict[str, Any]:
        return {
            "top_k": self.top_k,
            "follow_k": self.follow_k,
            "first_weight": self.first_weight,
            "follow_up": self.follow_up,
        }

    def score(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        return self.score_with_gains(model, state, candidates, targets)[0]

    def score_with_gains(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> tuple[Tensor, Tensor | None]:
        cand, tgt = _as_items(candidates), _as_items(targets)
        _check_targets(self.name, tgt)
        if not cand:
            return torch.zeros(0, dtype=DTYPE), torch.zeros(0, dtype=DTYPE)
        to_batch = _require(model, "to_batch", self.name, "a batch form of one state")
        scores, gains = self._scores(model, to_batch(state), cand, tgt)
        return scores[0], gains[0]

    def score_batch(
        self, model: BeliefModel, states: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        cand, tgt = _as_items(candidates), _as_items(targets)
        _check_targets(self.name, tgt)
        return self._scores(model, states, cand, tgt)[0]

    def _scores(
        self, model: BeliefModel, states: Any, cand: list[int], tgt: list[int]
    ) -> tuple[Tensor, Tensor]:
        """``(scores [B, C], one-step gains [B, C])``."""
        branch = _require(model, "branch_batch", self.name, "hypothetical next answers")
        p_x, p_t = model.lookahead_batch(states, cand, tgt)  # [B, C, O], [B, C, O, T, O]
        b, c_n = p_x.shape[0], len(cand)
        now = mean_target_entropy(model.predict_batch(states, tgt))  # [B]
        gains = now.unsqueeze(-1) - expected_target_entropy(p_x, p_t)  # [B, C]
        scores = gains.clone()
        cand_t = torch.tensor(cand, dtype=torch.long)
        responses = getattr(states, "responses", None)
        if isinstance(responses, Tensor) and responses.dim() == 2 and responses.shape[0] == b:
            askable = responses[:, cand_t] < 0  # [B, C]
        else:
            askable = torch.ones(b, c_n, dtype=torch.bool)
        ranked = gains.masked_fill(~askable, -math.inf)
        # Stable ranking: higher gain first, the earlier candidate on ties.
        order = torch.sort(-ranked, dim=1, stable=True).indices  # [B, C]
        top = order[:, : min(self.top_k, c_n)]  # [B, k]
        follow = order[:, : min(self.follow_k, c_n)]  # [B, F]
        n_ask = askable.sum(1)  # [B]
        n_opt = torch.tensor(model.item_bank.n_options, dtype=torch.long)
        # One hypothetical row per (respondent, top candidate, option of that candidate).
        k_n = top.shape[1]
        o_max = int(n_opt[cand_t].max())
        rb = torch.arange(b).view(b, 1, 1).expand(b, k_n, o_max)
        rj = torch.arange(k_n).view(1, k_n, 1).expand(b, k_n, o_max)
        ro = torch.arange(o_max).view(1, 1, o_max).expand(b, k_n, o_max)
        top_c = top.unsqueeze(2).expand(b, k_n, o_max)
        # a top candidate is scored only if it is askable and has a follow-up
        live = (
            (ro < n_opt[cand_t[top_c]])
            & askable.gather(1, top).unsqueeze(2)
            & (n_ask >= 2).view(b, 1, 1)
        )
        rb, rj, ro, rc = rb[live], rj[live], ro[live], top_c[live]
        if rb.numel() == 0:
            return scores, gains
        # Follow-up candidates: F of the row's respondent, without x itself (and askable).
        f_mask = torch.zeros(b, c_n, dtype=torch.bool)
        f_mask.scatter_(1, follow, True)
        f_mask &= askable
        f_cols = f_mask.any(0).nonzero().flatten()  # candidate columns needed by some row
        f_items = cand_t[f_cols].tolist()
        weight = p_x[rb, rc, ro]
        if self.follow_up == "adaptive":
            best = torch.empty(rb.numel(), dtype=DTYPE)
        else:  # E(x, x') = sum_k p(k) E(x' | h, Y_x = k), accumulated per (b, top x, x')
            joint = torch.zeros(b, k_n, f_cols.numel(), dtype=DTYPE)
        for s in range(0, rb.numel(), self.chunk_rows):
            sl = slice(s, s + self.chunk_rows)
            st = branch(states, rb[sl], cand_t[rc[sl]], ro[sl])
            px2, pt2 = model.lookahead_batch(st, f_items, tgt)
            e2 = expected_target_entropy(px2, pt2)  # [rows, |f_cols|]
            allowed = f_mask[rb[sl]][:, f_cols] & (f_cols.unsqueeze(0) != rc[sl].unsqueeze(1))
            if self.follow_up == "adaptive":
                best[sl] = e2.masked_fill(~allowed, math.inf).min(1).values
            else:
                e2 = e2.masked_fill(~allowed, math.inf) * weight[sl].unsqueeze(1)
                joint.index_put_(
                    (rb[sl], rj[sl]), torch.nan_to_num(e2, nan=math.inf), accumulate=True
                )
        if self.follow_up == "adaptive":
            two = torch.zeros(b, k_n, dtype=DTYPE).index_put_(
                (rb, rj), weight * best, accumulate=True
            )
        else:
            two = joint.min(2).values if f_cols.numel() else torch.zeros(b, k_n, dtype=DTYPE)
        scored = torch.zeros(b, k_n, dtype=torch.bool)
        scored[rb, rj] = True
        rows_s, cols_s = scored.nonzero(as_tuple=True)
        top_s = top[rows_s, cols_s]
        g2 = now[rows_s] - two[rows_s, cols_s]
        a = self.first_weight
        scores[rows_s, top_s] = a * gains[rows_s, top_s] + (1 - a) * g2
        return scores, gains


# --------------------------------------------------------------------------------------
def _require(model: BeliefModel, attr: str, criterion: str, what: str) -> Callable[..., Any]:
    fn = getattr(model, attr, None)
    if not callable(fn):
        raise CriterionNotApplicableError(
            f"criterion {criterion!r} needs {what} (method {attr!r}); "
            f"{type(model).__name__} (family {model.family!r}) has none"
        )
    return fn


def _answer_options(states: Any, item: int, option: int, b: int) -> Tensor:
    """Options ``[B]`` for a hypothetical batched update: ``option``, or ``-1`` (no update)
    for respondents whose state already holds an answer to ``item``.

    Batch states that record observed answers (a ``responses [B, I]`` attribute, as the
    persona-mixture states do) refuse a second answer to an item; their score for that
    item is meaningless anyway (callers mask items already asked).
    """
    opts = torch.full((b,), option, dtype=torch.long)
    responses = getattr(states, "responses", None)
    if isinstance(responses, Tensor) and responses.dim() == 2 and responses.shape[0] == b:
        opts = torch.where(responses[:, item] >= 0, torch.full_like(opts, MISSING), opts)
    return opts


@register_criterion
class PosteriorEntropy(SelectionCriterion):
    """Expected reduction of the entropy of the latent (persona) posterior.

    ``score(x) = H(p(θ | h)) - sum_k p(Y_x = k | h) H(p(θ | h, Y_x = k))``
    (METHODS.md section 1, an alternative of the paper). Ignores the targets: it learns
    *who* the respondent is, not specifically what they answer to the targets. Needs
    ``model.latent_posterior(state) -> [K]``; the batched form also needs
    ``model.latent_posterior_batch(states) -> [B, K]``. The posterior after each
    hypothetical answer comes from ``model.update`` / ``model.update_batch``.
    """

    name = "posterior_entropy"
    description = "expected reduction of the latent-posterior entropy (nats)"

    def score(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        latent = _require(model, "latent_posterior", self.name, "a latent posterior")
        cand = _as_items(candidates)
        if not cand:
            return torch.zeros(0, dtype=DTYPE)
        now = entropy(latent(state).to(DTYPE))
        p_x = model.predict(state, cand)  # [C, O]
        out = torch.empty(len(cand), dtype=DTYPE)
        n_opt = model.item_bank.n_options
        for ci, x in enumerate(cand):
            after = torch.stack(
                [entropy(latent(model.update(state, x, k)).to(DTYPE)) for k in range(n_opt[x])]
            )
            out[ci] = now - (p_x[ci, : n_opt[x]] * after).sum()
        return out

    def score_batch(
        self, model: BeliefModel, states: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        latent = _require(model, "latent_posterior_batch", self.name, "a batched latent posterior")
        cand = _as_items(candidates)
        post = latent(states).to(DTYPE)  # [B, K]
        b = post.shape[0]
        now = entropy(post)  # [B]
        p_x = model.predict_batch(states, cand)  # [B, C, O]
        out = torch.empty(b, len(cand), dtype=DTYPE)
        n_opt = model.item_bank.n_options
        items = torch.empty(b, dtype=torch.long)
        for ci, x in enumerate(cand):
            items.fill_(x)
            exp_h = torch.zeros(b, dtype=DTYPE)
            for k in range(n_opt[x]):
                opts = _answer_options(states, x, k, b)
                exp_h += p_x[:, ci, k] * entropy(latent(model.update_batch(states, items, opts)))
            out[:, ci] = now - exp_h
        return out


# --------------------------------------------------------------------------------------
@register_criterion
class RandomOrder(SelectionCriterion):
    """Uniformly random scores from a seeded generator (a fresh random order per call).

    Reproducible: two instances with the same ``seed`` give the same scores for the same
    sequence of calls. ``argmax`` of i.i.d. uniform scores is a uniformly random candidate.
    """

    name = "random"
    description = "uniformly random order (seeded)"

    def __init__(self, seed: int = 0) -> None:
        self.seed = int(seed)
        self._gen = torch.Generator().manual_seed(self.seed)

    def params(self) -> dict[str, Any]:
        return {"seed": self.seed}

    def score(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        return torch.rand(len(_as_items(candidates)), generator=self._gen, dtype=DTYPE)

    def score_batch(
        self, model: BeliefModel, states: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        b = model.predict_batch(states, _as_items(targets)[:1] or [0]).shape[0]
        return torch.rand(b, len(_as_items(candidates)), generator=self._gen, dtype=DTYPE)


# --------------------------------------------------------------------------------------
@register_criterion
class FixedOrder(SelectionCriterion):
    """A non-adaptive question order, chosen greedily under the population prior.

    "Algorithm 1" of METHODS.md section 1: one list for everybody. With ``S`` the items
    already in the list, the next item is

    ``x* = argmin_x E_{Y_S, Y_x ~ p} [ (1/|I*|) sum_t H(p(Y_t | Y_S, Y_x)) ]``

    where ``p`` is the model's prior predictive with no attribute observed (a respondent
    drawn from the whole population). The expectation over ``Y_x`` is always exact (the
    model's lookahead); the expectation over the answers ``Y_S`` to the earlier picks is

    * exact while the number of answer sequences of ``S`` is at most ``max_enumeration``:
      every sequence is enumerated with its prior probability
      ``p(Y_S) = prod_j p(Y_{s_j} | Y_{s_<j})``;
    * after that, a Monte Carlo average over ``n_simulated`` respondents simulated from
      the model (ancestral sampling: when the switch happens, sequences are drawn from the
      exact weighted enumeration; afterwards each simulated respondent draws its answer
      to every new pick from its own predictive), seeded by ``seed``.

    The order is computed in :meth:`prepare` (or at the first :meth:`score` call) on the
    candidate pool and cached for that model, pool and targets; it ignores the
    respondent's state. ``score`` is ``-position`` in the order (earlier = higher), so a
    caller that drops unavailable items asks the next available one in the list.
    ``length`` caps the greedy order (items after it keep the pool order).
    """

    name = "fixed"
    description = "one non-adaptive order chosen greedily under the prior (score = -position)"
    adaptive = False
    uses_fixed_order = True

    def __init__(
        self,
        max_enumeration: int = 1024,
        n_simulated: int = 1024,
        seed: int = 0,
        length: int | None = None,
        chunk_size: int = 256,
    ) -> None:
        if max_enumeration < 1 or n_simulated < 1 or chunk_size < 1:
            raise ElicitationError(
                "criterion 'fixed': max_enumeration, n_simulated and chunk_size must be >= 1"
            )
        if length is not None and length < 0:
            raise ElicitationError("criterion 'fixed': length must be >= 0")
        self.max_enumeration = int(max_enumeration)
        self.n_simulated = int(n_simulated)
        self.seed = int(seed)
        self.length = length
        self.chunk_size = int(chunk_size)
        self._model: BeliefModel | None = None
        self._pool: tuple[int, ...] = ()
        self._targets: tuple[int, ...] = ()
        self._order: list[int] = []
        self._modes: list[str] = []
        self._rank: dict[int, int] = {}

    def params(self) -> dict[str, Any]:
        return {
            "max_enumeration": self.max_enumeration,
            "n_simulated": self.n_simulated,
            "seed": self.seed,
            "length": self.length,
        }

    def explain(self) -> dict[str, Any]:
        out = super().explain()
        out["order"] = list(self._order)
        out["expectation"] = list(self._modes)
        return out

    @property
    def order(self) -> list[int]:
        """The cached order (empty before :meth:`prepare`)."""
        return list(self._order)

    @property
    def expectation(self) -> list[str]:
        """How each pick's expectation was computed (``exact`` / ``simulated(M)``)."""
        return list(self._modes)

    def prepare(self, model: BeliefModel, pool: ItemList, targets: ItemList) -> None:
        pool_t, tgt = tuple(_as_items(pool)), tuple(_as_items(targets))
        if self._model is model and self._pool == pool_t and self._targets == tgt:
            return
        _check_targets(self.name, list(tgt))
        order, modes = self._greedy(model, list(pool_t), list(tgt))
        self._set(model, pool_t, tgt, order, modes)

    def set_fixed_order(
        self,
        model: BeliefModel,
        pool: ItemList,
        targets: ItemList,
        order: ItemList,
        expectation: Sequence[str] = (),
    ) -> None:
        """Use a precomputed ``order`` of ``pool`` (e.g. stored with a fitted model).

        Afterwards :meth:`prepare` with the same ``model`` object, ``pool`` (same items in
        the same order) and ``targets`` does nothing, and scoring never runs the greedy
        search. ``order`` must be a permutation of ``pool`` (what :meth:`prepare` would
        cache); the caller is responsible for it having been computed for this model,
        pool, targets and :meth:`params`.

        Raises:
            ElicitationError: ``order`` is not a permutation of ``pool``, or no targets.
        """
        pool_t, tgt, order_l = tuple(_as_items(pool)), tuple(_as_items(targets)), _as_items(order)
        _check_targets(self.name, list(tgt))
        if sorted(order_l) != sorted(pool_t) or len(set(order_l)) != len(order_l):
            raise ElicitationError(
                f"criterion {self.name!r}: a stored order must list every item of the pool "
                f"exactly once (pool {list(pool_t)}, order {order_l})"
            )
        self._set(model, pool_t, tgt, order_l, list(expectation))

    def _set(
        self,
        model: BeliefModel,
        pool: tuple[int, ...],
        tgt: tuple[int, ...],
        order: list[int],
        modes: list[str],
    ) -> None:
        self._order, self._modes = order, modes
        self._rank = {item: pos for pos, item in enumerate(order)}
        self._model, self._pool, self._targets = model, pool, tgt

    def _positions(self, model: BeliefModel, cand: list[int], tgt: list[int]) -> Tensor:
        if not (
            self._model is model and self._targets == tuple(tgt) and set(cand) <= set(self._pool)
        ):
            self.prepare(model, cand, tgt)
        rank = self._rank
        return torch.tensor([-float(rank[c]) for c in cand], dtype=DTYPE)

    def score(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        cand = _as_items(candidates)
        if not cand:
            return torch.zeros(0, dtype=DTYPE)
        return self._positions(model, cand, _as_items(targets))

    def score_batch(
        self, model: BeliefModel, states: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        cand, tgt = _as_items(candidates), _as_items(targets)
        b = model.predict_batch(states, tgt[:1] or [0]).shape[0]
        if not cand:
            return torch.zeros(b, 0, dtype=DTYPE)
        return self._positions(model, cand, tgt).unsqueeze(0).expand(b, -1).clone()

    # ---- the greedy construction -------------------------------------------------
    def _expected(
        self, model: BeliefModel, obs: Tensor, logw: Tensor, remaining: list[int], tgt: list[int]
    ) -> tuple[Tensor, Tensor]:
        """Weighted expected target entropy ``[C]`` and each sequence's ``p_x [M, C, O]``."""
        w = torch.softmax(logw, 0)
        total = torch.zeros(len(remaining), dtype=DTYPE)
        p_xs = []
        for lo in range(0, obs.shape[0], self.chunk_size):
            states = model.initial_batch(obs[lo : lo + self.chunk_size])
            p_x, p_t = model.lookahead_batch(states, remaining, tgt)
            total += (w[lo : lo + self.chunk_size, None] * expected_target_entropy(p_x, p_t)).sum(0)
            p_xs.append(p_x)
        return total, torch.cat(p_xs)

    def _greedy(
        self, model: BeliefModel, pool: list[int], tgt: list[int]
    ) -> tuple[list[int], list[str]]:
        n_opt = model.item_bank.n_options
        gen = torch.Generator().manual_seed(self.seed)
        n_steps = len(pool) if self.length is None else min(self.length, len(pool))
        obs = torch.full((1, model.item_bank.n_items), MISSING, dtype=torch.long)
        logw = torch.zeros(1, dtype=DTYPE)
        remaining = list(pool)
        order: list[int] = []
        modes: list[str] = []
        exact = True
        for step in range(n_steps):
            modes.append("exact" if exact else f"simulated({obs.shape[0]})")
            score, p_x = self._expected(model, obs, logw, remaining, tgt)
            best = int(torch.argmin(score))
            x = remaining.pop(best)
            order.append(x)
            if step == n_steps - 1:
                break
            px = p_x[:, best, : n_opt[x]].clamp_min(0)  # [M, O_x]
            m = obs.shape[0]
            if exact and m * n_opt[x] <= self.max_enumeration:
                obs = obs.repeat_interleave(n_opt[x], 0)
                obs[:, x] = torch.arange(n_opt[x]).repeat(m)
                logw = (logw.unsqueeze(1) + px.clamp_min(1e-300).log()).reshape(-1)
                keep = px.reshape(-1) > 0
                obs, logw = obs[keep], logw[keep]
            else:
                if exact:  # switch: draw sequences from the exact weighted enumeration
                    idx = torch.multinomial(
                        torch.softmax(logw, 0), self.n_simulated, replacement=True, generator=gen
                    )
                    obs, px = obs[idx], px[idx]
                    logw = torch.zeros(self.n_simulated, dtype=DTYPE)
                    exact = False
                obs = obs.clone()
                obs[:, x] = torch.multinomial(px, 1, generator=gen).squeeze(1)
        order.extend(remaining)
        return order, modes


# --------------------------------------------------------------------------------------
DEFAULT_DELTA = 0.0005
"""Default ``delta`` (nats per position) of :class:`AnchoredInformationGain`, the app's
default criterion (``StudySettings.criterion``) and so the benchmark's ``default``: chosen
by 5-fold cross-validation over the training and validation users of the shipped
datasets, one value for every dataset (docs/benchmarks.md, "Selection rule")."""


@register_criterion
class AnchoredInformationGain(SelectionCriterion):
    """``eig`` anchored to the non-adaptive ``fixed`` order: adapt only when it pays.

    With ``G(x)`` the expected target-entropy reduction of ``x`` (``eig``, or
    ``eig_tempered`` with ``tau < 1``) and ``r(x)`` the number of candidates not yet
    answered by the respondent that come before ``x`` in the :class:`FixedOrder` list
    (``r = 0`` for the next question of the fixed order):

    ``score(x) = G(x) - delta * r(x)``

    so the respondent leaves the fixed order only where the model expects a question to
    tell more than the fixed order's next one by ``delta`` nats per position skipped.
    ``delta = 0`` is ``eig``; a very large ``delta`` is ``fixed``. The fixed order is a
    jointly good set under the population prior; the greedy adaptive pick is only
    greedy and trusts the posterior of a misspecified model, so the anchor hedges. The
    fixed order is computed in :meth:`prepare` (cached for a model, pool and targets), or
    handed over precomputed with :meth:`set_fixed_order` (a live study stores it with its
    fitted model; computing it costs seconds to a minute, scoring with it microseconds).

    With ``tau = 1`` the gains ``G`` are the exact one-step target gains, returned by
    :meth:`score_with_gains` so that a stopping rule needs no second lookahead.
    """

    name = "eig_anchored"
    description = "eig minus delta per position skipped in the non-adaptive fixed order"
    uses_fixed_order = True

    def __init__(
        self, delta: float = DEFAULT_DELTA, tau: float = 1.0, seed: int = 0, **fixed_kwargs: Any
    ) -> None:
        if delta < 0:
            raise ElicitationError(f"criterion {self.name!r}: delta must be >= 0")
        self.delta = float(delta)
        self._gain: SelectionCriterion = (
            ExpectedInformationGain() if tau == 1.0 else TemperedInformationGain(tau=tau)
        )
        self.tau = float(tau)
        self._fixed = FixedOrder(seed=seed, **fixed_kwargs)

    def params(self) -> dict[str, Any]:
        return {"delta": self.delta, "tau": self.tau, **self._fixed.params()}

    @property
    def fixed(self) -> FixedOrder:
        """The anchoring :class:`FixedOrder` (its ``params()`` identify the order)."""
        return self._fixed

    def prepare(self, model: BeliefModel, pool: ItemList, targets: ItemList) -> None:
        self._fixed.prepare(model, pool, targets)

    def set_fixed_order(
        self,
        model: BeliefModel,
        pool: ItemList,
        targets: ItemList,
        order: ItemList,
        expectation: Sequence[str] = (),
    ) -> None:
        """Anchor to a precomputed fixed ``order`` (see :meth:`FixedOrder.set_fixed_order`)."""
        self._fixed.set_fixed_order(model, pool, targets, order, expectation)

    def score_with_gains(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> tuple[Tensor, Tensor | None]:
        cand, tgt = _as_items(candidates), _as_items(targets)
        _check_targets(self.name, tgt)
        if not cand:
            empty = torch.zeros(0, dtype=DTYPE)
            return empty, (empty if self.tau == 1.0 else None)
        done: frozenset[int] = getattr(state, "observed_items", frozenset())
        asked = torch.tensor([[c in done for c in cand]])
        gains = self._gain.score(model, state, cand, tgt)
        scores = gains - self.delta * self._ranks(model, cand, tgt, asked)[0]
        return scores, (gains if self.tau == 1.0 else None)

    def _ranks(self, model: BeliefModel, cand: list[int], tgt: list[int], asked: Tensor) -> Tensor:
        """``r [B, C]``: unanswered candidates before each candidate in the fixed order."""
        pos = -self._fixed.score(model, None, cand, tgt)  # [C] positions in the order
        before = (pos.unsqueeze(0) < pos.unsqueeze(1)).to(DTYPE)  # [C, C]: j before i
        return (~asked).to(DTYPE) @ before.T  # [B, C]

    def score(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        return self.score_with_gains(model, state, candidates, targets)[0]

    def score_batch(
        self, model: BeliefModel, states: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        cand, tgt = _as_items(candidates), _as_items(targets)
        _check_targets(self.name, tgt)
        gains = self._gain.score_batch(model, states, cand, tgt)
        responses = getattr(states, "responses", None)
        if isinstance(responses, Tensor) and responses.dim() == 2:
            asked = responses[:, torch.tensor(cand, dtype=torch.long)] >= 0
        else:
            asked = torch.zeros(gains.shape, dtype=torch.bool)
        return gains - self.delta * self._ranks(model, cand, tgt, asked)


# --------------------------------------------------------------------------------------
@register_criterion
class IRTPosteriorVariance(SelectionCriterion):
    """Item response theory's adaptive-testing rule: expected posterior variance of θ.

    ``score(x) = Var(θ | h) - sum_k p(Y_x = k | h) Var(θ | h, Y_x = k)``
    (minimum expected posterior variance, as a non-negative reduction). Needs
    ``model.theta_posterior(state) -> (grid [Q], weights [Q])`` (a posterior on a
    quadrature grid, as in ``models.irt``); uses ``model.expected_posterior_variance``
    when the model provides it, else updates the state for each answer. The batched form
    uses ``model.theta_posterior_batch(states) -> (grid [Q], weights [B, Q])``.
    Ignores the targets (IRT's goal is θ itself).
    """

    name = "irt"
    description = "expected reduction of the posterior variance of the IRT ability θ"

    @staticmethod
    def _var(grid: Tensor, w: Tensor) -> Tensor:
        w = w.to(DTYPE)
        grid = grid.to(DTYPE)
        mean = (w * grid).sum(-1, keepdim=True)
        return (w * (grid - mean) ** 2).sum(-1)

    def score(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        theta = _require(model, "theta_posterior", self.name, "a posterior over θ")
        cand = _as_items(candidates)
        if not cand:
            return torch.zeros(0, dtype=DTYPE)
        grid, w = theta(state)
        now = self._var(grid, w)
        epv = getattr(model, "expected_posterior_variance", None)
        if callable(epv):
            return (now - torch.as_tensor(epv(state, cand), dtype=DTYPE)).reshape(-1)
        p_x = model.predict(state, cand)
        n_opt = model.item_bank.n_options
        out = torch.empty(len(cand), dtype=DTYPE)
        for ci, x in enumerate(cand):
            after = torch.stack(
                [self._var(*theta(model.update(state, x, k))) for k in range(n_opt[x])]
            )
            out[ci] = now - (p_x[ci, : n_opt[x]] * after).sum()
        return out

    def score_batch(
        self, model: BeliefModel, states: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        theta = _require(model, "theta_posterior_batch", self.name, "a batched posterior over θ")
        cand = _as_items(candidates)
        grid, w = theta(states)
        b = w.shape[0]
        now = self._var(grid, w)
        epv = getattr(model, "expected_posterior_variance_batch", None)
        if callable(epv):
            return now.unsqueeze(-1) - torch.as_tensor(epv(states, cand), dtype=DTYPE)
        p_x = model.predict_batch(states, cand)
        n_opt = model.item_bank.n_options
        out = torch.empty(b, len(cand), dtype=DTYPE)
        items = torch.empty(b, dtype=torch.long)
        for ci, x in enumerate(cand):
            items.fill_(x)
            exp_v = torch.zeros(b, dtype=DTYPE)
            for k in range(n_opt[x]):
                opts = _answer_options(states, x, k, b)
                g, wk = theta(model.update_batch(states, items, opts))
                exp_v += p_x[:, ci, k] * self._var(g, wk)
            out[:, ci] = now - exp_v
        return out


def best_index(scores: Tensor) -> int:
    """Index of the highest score (the first one on ties); ``-1`` for an empty tensor."""
    if scores.numel() == 0:
        return -1
    s = torch.nan_to_num(scores.to(DTYPE), nan=-math.inf)
    return int(torch.argmax(s))
