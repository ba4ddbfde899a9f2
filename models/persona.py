"""Persona-mixture belief model: a finite dictionary of personas with closed-form posteriors.

A respondent's hidden state is one persona ``θ`` out of ``K``. Persona ``θ`` answers item
``i`` with the distribution ``μ[θ, i, :]`` (a ``[K, I, O]`` tensor, zeros beyond ``O_i``),
independently across items given ``θ``:

    p(θ, Y) = p(θ) · Π_i μ[θ, i, Y_i]

so after the answers ``h = {(i, y)}`` the posterior and the predictive are closed form
(docs/methods.md §1, after "Adaptive Querying with AI Persona Priors", [1] there):

    log p(θ | h) = log p(θ) + Σ_{(i, y) ∈ h} log max(μ[θ, i, y], floor) − log Z
    p(Y_x = k | h) = Σ_θ μ[θ, x, k] · p(θ | h)

The likelihood of an observed answer uses ``max(μ, floor)`` (floor ``1e-10``) so that an
answer which every persona deems impossible never zeroes the whole posterior; predictives
use ``μ`` itself. One answer is one vector add of length ``K``.

The offline fits on a fixed dictionary ``μ`` (the empirical-Bayes prior, compression)
are in :mod:`models.persona_fit`.

Pure numerics (torch, float64): no web framework, no settings.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from models.base import (
    DTYPE,
    MISSING,
    BeliefModel,
    InvalidDistributionError,
    InvalidOptionError,
    ItemBank,
    ModelError,
    ShapeError,
    UnknownItemError,
    register_model,
)

# The grouped lookahead multiplies a torch sparse CSR matrix (built per call, structure
# checked once when the groups are made); torch flags CSR support as "beta" on first use.
warnings.filterwarnings("ignore", message=r"[Ss]parse CSR tensor support is in beta")

DEFAULT_FLOOR = 1e-10
_ROW_TOL = 1e-6
# Elements of the ``[chunk, K, C*O]`` temporary in the lookahead.
_CHUNK_ELEMS = 1 << 22


@dataclass(frozen=True, eq=False)
class PersonaState:
    """The posterior over personas of one respondent.

    Attributes:
        log_post: ``[K]`` normalised log posterior ``log p(θ | h)`` (logsumexp = 0).
        observed: the answers ``((item, option), ...)`` in the order they were observed,
            attributes first. Replaying them from :meth:`PersonaMixture.initial_state`
            gives the same state.
    """

    log_post: Tensor
    observed: tuple[tuple[int, int], ...] = ()

    @property
    def observed_items(self) -> frozenset[int]:
        return frozenset(i for i, _ in self.observed)


@dataclass(frozen=True, eq=False)
class PersonaBatchState:
    """Posteriors of ``B`` respondents.

    Attributes:
        log_post: ``[B, K]`` normalised log posteriors.
        responses: ``LongTensor [B, I]``: the observed option of each item, ``-1`` where
            nothing was observed (a skipped question stays ``-1``).
    """

    log_post: Tensor
    responses: Tensor

    @property
    def batch_size(self) -> int:
        return int(self.log_post.shape[0])


class _Groups(NamedTuple):
    """Personas grouped by equal target rows (see ``PersonaMixture._target_groups``).

    ``group [K]``: group of each persona; ``order [K]``: personas sorted by group;
    ``crow [G + 1]``: row pointers of the groups into ``order`` (for a CSR matrix);
    ``lik_sorted``: ``max(μ, floor)`` as ``[K, I*O]`` with rows in ``order`` (contiguous); ``table [G, T*O]``: the distinct target rows (or ``[K, T*O]`` per persona
    when ``order`` is ``None``).
    """

    group: Tensor | None
    order: Tensor | None
    crow: Tensor | None
    lik_sorted: Tensor | None
    table: Tensor
    table_t: Tensor  # table.T, contiguous ([T*O, G])
    cols_k: Tensor | None  # arange(K): column indices of one respondent's rows


def cols_of(items: Tensor, n_options: int) -> Tensor:
    """Flat column indices ``item * O + k`` (``k < O``) of ``items`` in an ``[., I*O]`` table."""
    return (items.unsqueeze(1) * n_options + torch.arange(n_options)).reshape(-1)


def normalise_log(log_w: Tensor) -> Tensor:
    """``log_w - logsumexp(log_w)`` over the last axis."""
    return log_w - torch.logsumexp(log_w, dim=-1, keepdim=True)


def _validate_mu(mu: Tensor, item_bank: ItemBank, what: str = "mu") -> Tensor:
    """Check a ``[K, I, O]`` answer-distribution table against ``item_bank``; return float64."""
    if not isinstance(mu, Tensor):
        mu = torch.as_tensor(mu)
    if not (mu.is_floating_point() or mu.dtype in (torch.int32, torch.int64)):
        raise ShapeError(f"{what} must be a real tensor, got dtype {mu.dtype}")
    mu = mu.to(DTYPE)
    i_n, o_n = item_bank.n_items, item_bank.max_options
    if mu.dim() != 3 or mu.shape[1] != i_n or mu.shape[2] != o_n or mu.shape[0] < 1:
        raise ShapeError(
            f"{what} must have shape [K, {i_n}, {o_n}] with K >= 1, got {list(mu.shape)}"
        )
    if not bool(torch.isfinite(mu).all()):
        k, i, o = (int(v) for v in (~torch.isfinite(mu)).nonzero()[0])
        raise InvalidDistributionError(
            f"{what}[{k}, {i}, {o}] (item {item_bank.keys[i]!r}) is not finite"
        )
    if bool((mu < 0).any()):
        k, i, o = (int(v) for v in (mu < 0).nonzero()[0])
        raise InvalidDistributionError(
            f"{what}[{k}, {i}, {o}] (item {item_bank.keys[i]!r}) is negative: {float(mu[k, i, o])}"
        )
    valid = item_bank.option_mask()  # [I, O]
    beyond = (mu != 0) & ~valid.unsqueeze(0)
    if bool(beyond.any()):
        k, i, o = (int(v) for v in beyond.nonzero()[0])
        raise InvalidDistributionError(
            f"{what}[{k}, {i}, {o}] puts mass on option {o} of item {item_bank.keys[i]!r}, "
            f"which has only {item_bank.n_options[i]} options"
        )
    sums = mu.sum(-1)
    bad = (sums - 1).abs() > _ROW_TOL
    if bool(bad.any()):
        k, i = (int(v) for v in bad.nonzero()[0])
        raise InvalidDistributionError(
            f"{what}[{k}, {i}, :] (persona {k}, item {item_bank.keys[i]!r}) sums to "
            f"{float(sums[k, i]):.6g}, not 1"
        )
    return mu


def _validate_log_prior(log_prior: Tensor | None, k: int) -> Tensor:
    """A normalised ``[K]`` log prior (uniform when ``None``)."""
    if log_prior is None:
        return torch.full((k,), -math.log(k), dtype=DTYPE)
    log_prior = torch.as_tensor(log_prior).to(DTYPE)
    if log_prior.shape != (k,):
        raise ShapeError(f"log_prior must have shape [{k}], got {list(log_prior.shape)}")
    if bool(torch.isnan(log_prior).any()) or bool((log_prior == math.inf).any()):
        raise InvalidDistributionError("log_prior has NaN or +inf entries")
    if bool((log_prior == -math.inf).all()):
        raise InvalidDistributionError("log_prior gives zero probability to every persona")
    return normalise_log(log_prior)


def one_hot_responses(responses: Tensor, item_bank: ItemBank) -> Tensor:
    """Float one-hot encoding ``[N, I * O]`` of a response matrix (missing → all zeros).

    Column ``i * O + k`` is 1 when respondent ``u`` answered option ``k`` to item ``i``, so
    ``one_hot @ log_table.reshape(K, I * O).T`` sums log-probabilities over the observed
    answers only.
    """
    y = item_bank.check_responses(responses)
    n, i_n = y.shape
    o_n = item_bank.max_options
    out = torch.zeros(n, i_n, o_n, dtype=DTYPE)
    obs = y >= 0
    out[obs.nonzero(as_tuple=True) + (y[obs],)] = 1.0
    return out.reshape(n, i_n * o_n)


def _group_sums(crow_g: Tensor, cols_g: Tensor, w: Tensor, g_n: int) -> Tensor:
    """The ``[B·G, K]`` CSR matrix, block-diagonal in respondents, whose row ``(r, g)``
    sums ``w [B, K]`` (persona columns in group order) over the personas of group ``g``;
    ``crow_g [G + 1]`` / ``cols_g [K]`` are one respondent's row pointers and columns."""
    bc, k = w.shape
    if bc == 1:
        crow, cols_k = crow_g, cols_g
    else:
        crow = torch.cat(
            [
                (crow_g[:-1].unsqueeze(0) + k * torch.arange(bc).unsqueeze(1)).reshape(-1),
                torch.tensor([bc * k]),
            ]
        )
        cols_k = cols_g.repeat(bc)
    return torch.sparse_csr_tensor(
        crow, cols_k, w.reshape(-1), (bc * g_n, k), check_invariants=False
    )


@register_model
class PersonaMixture(BeliefModel):
    """A finite mixture of personas with independent per-item answer distributions.

    Args:
        item_bank: the items (``I`` items, ``O = max O_i`` options).
        mu: ``[K, I, O]`` answer distributions; each row sums to 1 over the item's own
            options and is 0 beyond them.
        log_prior: ``[K]`` log prior ``log p(θ)`` (normalised here); uniform when ``None``.
        floor: probability floor applied to ``μ`` in the likelihood of observed answers.
        labels: optional persona names (e.g. profile ids), length ``K``.
        evidence: optional ``[K, I]``: how many answers ``μ[θ, i, :]`` was estimated from
            (a latent-class fit's ``Σ_u γ[u, θ] 1[y_ui ≠ −1]``; ``inf`` for a persona
            whose distributions were given); ``None``: every ``μ`` is taken as given.
            Only :meth:`evidence_view` reads it.

    Raises:
        ShapeError: ``mu``, ``log_prior`` or ``evidence`` has the wrong shape.
        InvalidDistributionError: a row of ``mu`` is negative, not finite, does not sum to 1,
            or puts mass beyond its item's options; or the prior is degenerate.
    """

    family = "persona_mixture"

    def __init__(
        self,
        item_bank: ItemBank,
        mu: Tensor,
        log_prior: Tensor | None = None,
        *,
        floor: float = DEFAULT_FLOOR,
        labels: Sequence[str] | None = None,
        evidence: Tensor | None = None,
    ) -> None:
        super().__init__(item_bank)
        if not 0 < floor < 1:
            raise ModelError(f"floor must be in (0, 1), got {floor}")
        self.mu = _validate_mu(mu, item_bank)
        k = self.mu.shape[0]
        self.log_prior = _validate_log_prior(log_prior, k)
        self.floor = float(floor)
        if labels is not None and len(labels) != k:
            raise ShapeError(f"labels must have length {k}, got {len(labels)}")
        self.labels: tuple[str, ...] | None = (
            tuple(str(x) for x in labels) if labels is not None else None
        )
        if evidence is not None:
            evidence = torch.as_tensor(evidence, dtype=DTYPE)
            if evidence.shape != (k, item_bank.n_items):
                raise ShapeError(
                    f"evidence must have shape [{k}, {item_bank.n_items}], "
                    f"got {list(evidence.shape)}"
                )
            if bool((evidence < 0).any()) or bool(evidence.isnan().any()):
                raise ModelError("evidence must be >= 0 (answer counts)")
        self.evidence: Tensor | None = evidence
        self._precompute()

    # ----- derived tables ---------------------------------------------------
    def _precompute(self) -> None:
        """Tables in ``[I, O, K]`` layout so one item's column is a contiguous ``K`` vector.

        ``lik`` is ``max(μ, floor)`` on valid options and 0 beyond them (the likelihood
        used by updates); ``log_lik`` its log with 0 beyond the options (never selected,
        and 0 keeps one-hot matmuls finite).
        """
        valid = self.item_bank.option_mask().unsqueeze(0)  # [1, I, O]
        lik = torch.where(valid, self.mu.clamp_min(self.floor), torch.zeros((), dtype=DTYPE))
        log_lik = torch.where(valid, lik.clamp_min(self.floor).log(), torch.zeros((), dtype=DTYPE))
        self._mu_t = self.mu.permute(1, 2, 0).contiguous()  # [I, O, K]
        self._log_lik_t = log_lik.permute(1, 2, 0).contiguous()  # [I, O, K]
        self._log_lik_flat = log_lik.reshape(self.n_personas, -1)  # [K, I*O]
        self.lik_k = lik.contiguous()  # [K, I, O]
        self._lik_flat = self.lik_k.reshape(self.n_personas, -1)  # [K, I*O]
        self._mu_flat = self.mu.reshape(self.n_personas, -1)  # [K, I*O]
        self._group_cache: dict[tuple[int, ...], _Groups] = {}
        # True when the floor changes some valid entry (then L != μ and p_x needs μ).
        self._floor_active = bool((lik != self.mu).any())
        self._n_opt = torch.tensor(self.item_bank.n_options, dtype=torch.long)
        self._valid = self.item_bank.option_mask()  # [I, O] bool

    @property
    def n_personas(self) -> int:
        return int(self.mu.shape[0])

    @property
    def log_lik_table(self) -> Tensor:
        """``[K, I, O]`` ``log max(μ, floor)`` on valid options, 0 beyond them."""
        return self._log_lik_flat.reshape(self.mu.shape)

    def with_prior(self, log_prior: Tensor) -> PersonaMixture:
        """The same dictionary with another prior (e.g. the EM prior)."""
        out = type(self).__new__(type(self))
        out.__dict__.update(self.__dict__)
        out.log_prior = _validate_log_prior(log_prior, self.n_personas)
        out.metrics = dict(self.metrics)
        out._views = {}
        return out

    def evidence_view(self, strength: float) -> PersonaMixture:
        """The mixture with each ``μ[θ, i, :]`` shrunk towards the population predictive by
        how little evidence it rests on (what a selection criterion may trust).

        With ``e = evidence[θ, i]``, ``m = strength`` and ``p̄[i] = Σ_θ p(θ) μ[θ, i]``:

        ``μ'[θ, i] = w μ[θ, i] + (1 − w) p̄[i]``,  ``w = e / (e + m)``

        i.e. ``m`` answers of the population's distribution added to the ``e`` answers of
        the class. A class estimated from few answers to an item looks less distinct than
        its point estimate says; with ``e ≫ m`` nothing moves. Same prior, labels and
        floor; no evidence. Returns ``self`` without ``evidence`` or with ``m = 0``;
        cached per ``m``.

        Example: ``μ[:, i] = [[0.9, 0.1], [0.2, 0.8]]``, ``p(θ) = [0.5, 0.5]``, ``e[:, i] =
        [5, 15]``, ``m = 5``: ``p̄ = [0.55, 0.45]``, ``w = [0.5, 0.75]``, ``μ'[:, i] =
        [[0.725, 0.275], [0.2875, 0.7125]]``.
        """
        if self.evidence is None or strength <= 0:
            return self
        views = self.__dict__.setdefault("_views", {})
        if strength not in views:
            pop = torch.einsum("k,kio->io", self.log_prior.exp(), self.mu)  # [I, O]
            w = (1.0 - strength / (self.evidence + strength)).unsqueeze(-1)  # [K, I, 1]
            mu = w * self.mu + (1.0 - w) * pop.unsqueeze(0)
            mu = mu * self._valid.unsqueeze(0)
            mu = mu / mu.sum(-1, keepdim=True).clamp_min(1e-300)
            views[strength] = PersonaMixture(
                self.item_bank, mu, self.log_prior, floor=self.floor, labels=self.labels
            )
        return views[strength]

    # ----- constructors -----------------------------------------------------
    @classmethod
    def from_deterministic(
        cls,
        answers: Tensor,
        item_bank: ItemBank,
        epsilon: float,
        log_prior: Tensor | None = None,
        *,
        floor: float = DEFAULT_FLOOR,
        labels: Sequence[str] | None = None,
    ) -> PersonaMixture:
        """Personas from single answers: ``1 − ε`` on the answer, ``ε / (O_i − 1)`` elsewhere.

        Args:
            answers: ``LongTensor [K, I]``: persona ``θ``'s answer to item ``i`` (0-based);
                ``-1`` (no answer) gives the uniform distribution over the item's options.
            item_bank: the items.
            epsilon: noise level in ``[0, 1)`` (docs/methods.md: 0.05 synthetic, 0.5 real users).
            log_prior: optional ``[K]`` log prior.

        Returns:
            The mixture with ``μ[θ, i, k] = 1 − ε`` if ``k = answers[θ, i]`` else
            ``ε / (O_i − 1)`` (1 for single-option items).
        """
        if not 0 <= epsilon < 1:
            raise ModelError(f"epsilon must be in [0, 1), got {epsilon}")
        answers = torch.as_tensor(answers)
        if answers.dim() != 2 or answers.shape[1] != item_bank.n_items:
            raise ShapeError(
                f"answers must have shape [K, {item_bank.n_items}], got {list(answers.shape)}"
            )
        if answers.is_floating_point():
            if not bool((answers == answers.round()).all()):
                raise ShapeError("answers must be integer option indices")
        answers = item_bank.check_responses(answers.long())
        k, i_n = answers.shape
        o_n = item_bank.max_options
        n_opt = torch.tensor(item_bank.n_options, dtype=DTYPE)  # [I]
        valid = item_bank.option_mask()  # [I, O]
        off = torch.where(n_opt > 1, epsilon / (n_opt - 1).clamp_min(1), torch.ones_like(n_opt))
        on = torch.where(n_opt > 1, torch.full_like(n_opt, 1 - epsilon), torch.ones_like(n_opt))
        mu = off.view(1, i_n, 1).expand(k, i_n, o_n).clone()
        mu = mu * valid.unsqueeze(0)
        ans = answers.clamp_min(0).unsqueeze(-1)  # [K, I, 1]
        mu.scatter_(2, ans, on.view(1, i_n, 1).expand(k, i_n, 1).clone())
        missing = (answers < 0).unsqueeze(-1)
        uniform = (valid / n_opt.unsqueeze(1)).unsqueeze(0).expand(k, i_n, o_n)
        mu = torch.where(missing, uniform, mu)
        return cls(item_bank, mu, log_prior, floor=floor, labels=labels)

    # ----- checks ------------------------------------------------------------
    def _items(self, items: Sequence[int] | Tensor | None) -> Tensor:
        """Validated ``LongTensor [n]`` of item indices (all items when ``None``)."""
        if items is None:
            return torch.arange(self.item_bank.n_items)
        idx = torch.as_tensor(items)
        if idx.is_floating_point():
            raise ShapeError(f"item indices must be integers, got dtype {idx.dtype}")
        idx = idx.long().reshape(-1)
        if idx.numel():
            lo, hi = int(idx.min()), int(idx.max())
            if lo < 0 or hi >= self.item_bank.n_items:
                bad = lo if lo < 0 else hi
                raise UnknownItemError(
                    f"unknown item index {bad} (the bank has {self.item_bank.n_items} items)"
                )
        return idx

    def _check_state(self, state: PersonaState) -> None:
        if not isinstance(state, PersonaState) or state.log_post.shape != (self.n_personas,):
            raise ShapeError(
                f"expected a PersonaState over {self.n_personas} personas, got {type(state).__name__}"
            )

    def _check_batch(self, state: PersonaBatchState) -> None:
        if (
            not isinstance(state, PersonaBatchState)
            or state.log_post.dim() != 2
            or state.log_post.shape[1] != self.n_personas
        ):
            raise ShapeError(
                f"expected a PersonaBatchState over {self.n_personas} personas, "
                f"got {type(state).__name__}"
            )

    # ----- one respondent ----------------------------------------------------
    def initial_state(self, attributes: Mapping[int, int] | None = None) -> PersonaState:
        """The prior conditioned on observed attributes ``{item: option}`` (observed items)."""
        log_post = self.log_prior.clone()
        observed: list[tuple[int, int]] = []
        for item, option in (attributes or {}).items():
            i, o = self.item_bank.check_answer(item, option)
            log_post = log_post + self._log_lik_t[i, o]
            observed.append((i, o))
        return PersonaState(normalise_log(log_post), tuple(observed))

    def update(self, state: PersonaState, item: int, option: int) -> PersonaState:
        """``log p(θ | h, y) = log p(θ | h) + log max(μ[θ, item, y], floor) − log Z``.

        Raises:
            UnknownItemError / InvalidOptionError: bad item or option.
            ModelError: ``item`` was already observed in this state (answers are counted once).
        """
        self._check_state(state)
        i, o = self.item_bank.check_answer(item, option)
        if any(j == i for j, _ in state.observed):
            raise ModelError(f"item {self.item_bank.keys[i]!r} was already observed in this state")
        log_post = normalise_log(state.log_post + self._log_lik_t[i, o])
        return PersonaState(log_post, state.observed + ((i, o),))

    def latent_posterior(self, state: PersonaState) -> Tensor:
        """``[K]`` posterior probabilities ``p(θ | h)`` (sums to 1)."""
        self._check_state(state)
        return state.log_post.exp()

    def predict(self, state: PersonaState, items: Sequence[int] | Tensor | None = None) -> Tensor:
        """``[n, O]``: ``p(Y_x = k | h) = Σ_θ μ[θ, x, k] p(θ | h)``."""
        self._check_state(state)
        idx = self._items(items)
        w = state.log_post.exp()
        if idx.numel() * 4 > self.item_bank.n_items:
            return self._mu_t[idx] @ w
        # A few items (a live step's targets): gather their valid option rows only; the
        # padded [n, O, K] gather copied up to O/O_i times more than it used.
        rows, _, slots = self._valid_rows(idx)
        out = torch.zeros(idx.numel() * self.item_bank.max_options, dtype=DTYPE)
        out[slots] = self._valid_tables()[1][rows] @ w
        return out.reshape(idx.numel(), self.item_bank.max_options)

    def lookahead(
        self,
        state: PersonaState,
        candidates: Sequence[int] | Tensor,
        targets: Sequence[int] | Tensor,
    ) -> tuple[Tensor, Tensor]:
        """Closed-form lookahead for all candidates at once (no loop over candidates).

        With ``w = p(θ | h)`` and ``L = max(μ, floor)`` (the update likelihood):

            p_x[c, k]       = Σ_θ w_θ μ[θ, x_c, k]
            p_t[c, k, t, j] = Σ_θ w_θ L[θ, x_c, k] μ[θ, t, j] / Σ_θ w_θ L[θ, x_c, k]

        which equals ``predict(update(state, x_c, k), targets)``. Both sums are one matmul
        ``[C·O, K] @ [K, T·O]``.

        Returns:
            ``p_x [C, O]`` and ``p_t [C, O, T, O]``; rows ``k >= O_{x_c}`` of ``p_t`` hold the
            current target predictive (weight 0 in ``p_x``).
        """
        self._check_state(state)
        cand = self._items(candidates)
        tgt = self._items(targets)
        w = state.log_post.exp().unsqueeze(0)  # [1, K]
        p_x, p_t = self._lookahead_core(w, cand, tgt)
        return p_x[0], p_t[0]

    def target_entropy_lookahead(
        self,
        state: PersonaState,
        candidates: Sequence[int] | Tensor,
        targets: Sequence[int] | Tensor,
    ) -> tuple[Tensor, Tensor]:
        """``(H_now, E [C])``: what ``eig`` needs from :meth:`lookahead`, without padding.

        ``H_now = (1/T) Σ_t H(p(Y_t | h))`` and
        ``E[c] = Σ_k p_x[c, k] (1/T) Σ_t H(p_t[c, k, t, :])``, the same numbers as
        ``mean_target_entropy(predict(state, targets))`` and
        ``expected_target_entropy(*lookahead(state, candidates, targets))`` (up to
        floating-point rounding), computed on the valid (item, option) columns only.

        Why: :meth:`lookahead` returns ``[C, O, T, O]`` padded to the bank's largest
        option count ``O``. One 16-option attribute makes that 64 times the real work for
        two-option questions (the CES demo: a 320 x 80 block of which 40 x 10 is real),
        and the padding, not the product, was most of a live step's time. Here:

            A = [μ[:, valid target columns] | 1]          [K, V_t + 1]   (cached per targets)
            R = (A^T ⊙ w) @ L[:, valid candidate columns]   [V_t + 1, V_c]
            den = R[V_t],  cond = R[:V_t] / den
            h[j] = -(1/T) Σ_rows xlogy(cond, cond)[:, j]   (the sum over a target's
                   options and the mean over targets are one column sum)
            E = segment_sum_over_candidates(p_x ⊙ h),  p_x = den (μ when the floor is active)

        Persona dictionaries whose target rows group well (:meth:`_target_groups`) keep
        the grouped :meth:`lookahead`, which is cheaper for them.
        """
        self._check_state(state)
        cand = self._items(candidates) if len(candidates) else torch.zeros(0, dtype=torch.long)
        tgt = self._items(targets) if len(targets) else torch.zeros(0, dtype=torch.long)
        c_n, t_n = int(cand.numel()), int(tgt.numel())
        if t_n == 0:
            raise ModelError("target_entropy_lookahead needs at least one target item")
        if c_n == 0:
            h_now = -torch.special.xlogy(p := self.predict(state, tgt), p).sum() / t_n
            return h_now, torch.zeros(0, dtype=DTYPE)
        if self._target_groups(tgt).order is not None:
            p_x, p_t = self.lookahead(state, cand, tgt)
            p_now = self.predict(state, tgt)
            h_now = -torch.special.xlogy(p_now, p_now).sum() / t_n
            h = -torch.special.xlogy(p_t, p_t).sum((-1, -2)) / t_n  # [C, O]
            return h_now, (p_x * h).sum(-1)
        a_t = self._target_table(tgt)  # [V_t + 1, K]
        lik_vt, mu_vt, _ = self._valid_tables()
        rows, seg, _ = self._valid_rows(cand)
        w = state.log_post.exp()  # [K]
        r = (a_t * w) @ lik_vt[rows].T  # [V_t + 1, V_c]
        den = r[-1]
        cond = r[:-1] / torch.where(den > 0, den, torch.ones((), dtype=DTYPE))
        h = -torch.special.xlogy(cond, cond).sum(0) / t_n  # [V_c]
        p_x = mu_vt[rows] @ w if self._floor_active else den
        expected = torch.zeros(c_n, dtype=DTYPE).index_add_(0, seg, p_x * h)
        p_now = a_t[:-1] @ w  # [V_t]
        return -torch.special.xlogy(p_now, p_now).sum() / t_n, expected

    def _valid_tables(self) -> tuple[Tensor, Tensor, list[int]]:
        """``(L^T, μ^T, starts)``: the tables restricted to valid (item, option) rows,
        ``[V, K]`` contiguous (``V = Σ_i O_i``; item ``i``'s options are rows
        ``starts[i] .. starts[i + 1] - 1``), built once per model: one row per option, so
        gathering a candidate's options copies contiguous ``K``-vectors instead of striding
        through the padded ``[K, I*O]`` table (whose cache misses dominated a live step)."""
        hit = self.__dict__.get("_valid_t")
        if hit is None:
            flat = self._valid.reshape(-1).nonzero().flatten()
            lik_vt = self._lik_flat[:, flat].T.contiguous()
            mu_vt = self._mu_flat[:, flat].T.contiguous() if self._floor_active else lik_vt
            starts = [0]
            for n in self._n_opt.tolist():
                starts.append(starts[-1] + int(n))
            hit = (lik_vt, mu_vt, starts)
            self.__dict__["_valid_t"] = hit
        return hit  # type: ignore[no-any-return]

    def _target_table(self, tgt: Tensor) -> Tensor:
        """``[V_t + 1, K]``: ``μ`` of the targets' valid options, then a row of ones
        (cached per target tuple; see :meth:`target_entropy_lookahead`)."""
        key = tuple(tgt.tolist())
        cache = self.__dict__.setdefault("_target_tables", {})
        hit = cache.get(key)
        if hit is None:
            mu_vt = self._valid_tables()[1]
            rows, _, _ = self._valid_rows(tgt)
            hit = torch.cat([mu_vt[rows], torch.ones(1, self.n_personas, dtype=DTYPE)])
            if len(cache) >= 16:
                cache.clear()
            cache[key] = hit.contiguous()
        return hit

    def _valid_rows(self, items: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(rows, position, slot)``, each ``[V]``: the rows of :meth:`_valid_tables` that
        hold each item's options, the index in ``items`` each row belongs to, and where
        that option sits in a flat padded ``[len(items), O]`` block."""
        starts = self._valid_tables()[2]
        o_n = self.item_bank.max_options
        rows: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        for p, i in enumerate(items.tolist()):
            n = starts[i + 1] - starts[i]
            rows.extend(range(starts[i], starts[i + 1]))
            pos.extend([p] * n)
            slots.extend(range(p * o_n, p * o_n + n))
        return (
            torch.tensor(rows, dtype=torch.long),
            torch.tensor(pos, dtype=torch.long),
            torch.tensor(slots, dtype=torch.long),
        )

    def _target_groups(self, tgt: Tensor) -> _Groups:
        """Personas that share the same target distributions, for a cheaper lookahead.

        Personas are merged only when their target rows ``μ[θ, targets, :]`` are
        bit-for-bit equal, so results are exact. Grouping is used when it at least halves
        ``K``; otherwise ``order`` is ``None`` and ``table`` holds one row per persona.
        Cached per target tuple (the dictionary never changes after construction).
        """
        key = tuple(tgt.tolist())
        hit = self._group_cache.get(key)
        if hit is not None:
            return hit
        k = self.n_personas
        rows = self.mu[:, tgt, :].reshape(k, -1)  # [K, T*O]
        uniq, inverse = torch.unique(rows, dim=0, return_inverse=True)
        g_n = int(uniq.shape[0])
        if 2 * g_n <= k:
            order = torch.argsort(inverse, stable=True)
            counts = torch.bincount(inverse, minlength=g_n)
            crow = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
            lik_sorted = self._lik_flat[order].contiguous()
            out = _Groups(
                inverse,
                order,
                crow,
                lik_sorted,
                uniq.contiguous(),
                uniq.T.contiguous(),
                torch.arange(k),
            )
        else:
            out = _Groups(None, None, None, None, rows.contiguous(), rows.T.contiguous(), None)
        if len(self._group_cache) >= 8:  # each entry holds a [K, I*O] table
            self._group_cache.clear()
        self._group_cache[key] = out
        return out

    def _lookahead_core(self, w: Tensor, cand: Tensor, tgt: Tensor) -> tuple[Tensor, Tensor]:
        """Batched closed form for ``w [B, K]``: ``p_x [B, C, O]``, ``p_t [B, C, O, T, O]``.

        ``joint[b, t·j, x·k] = Σ_g table[g, t·j] · agg[b, g, x·k]`` with
        ``agg[b, g, x·k] = Σ_{θ ∈ g} w[b, θ] L[θ, x, k]`` (one sparse-times-dense product,
        a single pass over the ``[K, I·O]`` table, which is what bounds the time);
        ``den[b, x·k] = Σ_g agg[b, g, x·k]``. Without useful groups, one dense product
        ``[T·O + 1, K] @ [K, I·O]`` gives ``joint`` and ``den`` together. When most items are
        candidates, all items are computed from the stored tables (no gather) and the
        candidate columns picked after. Only valid (item, option) columns are computed on
        either side (padding beyond ``O_i`` is never multiplied), which matters when one
        item has many more options than the others.
        """
        b, k = w.shape
        o_n = self.item_bank.max_options
        c_n, t_n = int(cand.numel()), int(tgt.numel())
        to_n, co_n = t_n * o_n, c_n * o_n
        grp = self._target_groups(tgt)
        valid = self._valid
        cols = cols_of(cand, o_n)
        dense_c = bool(valid[cand].all())  # no padded candidate rows
        dense_t = bool(valid[tgt].all())
        vc = torch.arange(co_n) if dense_c else valid[cand].reshape(-1).nonzero().flatten()
        vt = torch.arange(to_n) if dense_t else valid[tgt].reshape(-1).nonzero().flatten()
        if not dense_c:
            cols = cols[vc]  # the valid rows' columns in the [K, I*O] tables
        n_vc, n_vt = int(vc.numel()), int(vt.numel())
        full = 2 * n_vc > self._lik_flat.shape[1]  # use the stored table, pick columns after
        table = grp.table if dense_t else grp.table[:, vt]  # [G or K, n_vt]
        table_t = grp.table_t if dense_t else table.T.contiguous()
        grouped = grp.order is not None
        if grouped:
            assert grp.crow is not None and grp.group is not None and grp.lik_sorted is not None
            assert grp.cols_k is not None and grp.order is not None
            g_crow, g_cols = grp.crow, grp.cols_k
            g_n = table.shape[0]
            lik_g = grp.lik_sorted if full else grp.lik_sorted[:, cols]  # [K, M]
            m = lik_g.shape[1]
            w_sorted = w[:, grp.order]  # [B, K]
            per_row = max(g_n * m, n_vt * m)
        else:
            lik_src = self._lik_flat if full else self._lik_flat[:, cols]  # [K, M]
            m = lik_src.shape[1]
            aug = torch.cat([table, torch.ones(k, 1, dtype=DTYPE)], dim=1)  # [K, n_vt+1]
            per_row = max(k * (n_vt + 1), (n_vt + 1) * m)
        base: Tensor | None = None  # the current target predictive [B, T*O], when needed

        def current() -> Tensor:
            nonlocal base
            if base is None:
                base = w @ self._mu_flat[:, cols_of(tgt, o_n)]
            return base

        chunk = max(1, _CHUNK_ELEMS // per_row)
        dense = dense_c and dense_t
        one_chunk = dense and chunk >= b  # results are the chunk's tensors (no copies)
        if one_chunk:
            p_x = p_t = torch.empty(0, dtype=DTYPE)
        elif dense:
            p_x = torch.zeros(b, co_n, dtype=DTYPE)
            p_t = torch.empty(b, co_n, to_n, dtype=DTYPE)
        else:  # padded rows keep the current predictive
            p_x = torch.zeros(b, co_n, dtype=DTYPE)
            p_t = current().unsqueeze(1).repeat(1, co_n, 1)
        for s in range(0, b, chunk):
            bc = min(chunk, b - s)
            if grouped:
                sel = _group_sums(g_crow, g_cols, w_sorted[s : s + bc], g_n)
                agg = (sel @ lik_g).reshape(bc, g_n, m)  # [b, G, M]
                joint = torch.matmul(table_t, agg)  # [b, n_vt, M]
                den = agg.sum(1)  # [b, M]
            else:
                a = (w[s : s + bc].unsqueeze(2) * aug.unsqueeze(0)).transpose(1, 2)
                res = torch.matmul(a, lik_src)  # [b, n_vt+1, M]
                joint, den = res[:, :n_vt], res[:, n_vt]
            if full:
                joint, den = joint[:, :, cols], den[:, cols]
            pos = den > 0
            if bool(pos.all()):
                cond = joint.transpose(1, 2) / den.unsqueeze(2)  # [b, n_vc, n_vt]
            else:  # an answer of probability 0: its row keeps the current predictive
                safe = torch.where(pos, den, torch.ones((), dtype=DTYPE))
                cond = torch.where(
                    pos.unsqueeze(2),
                    joint.transpose(1, 2) / safe.unsqueeze(2),
                    current()[s : s + bc, vt].unsqueeze(1),
                )
            if one_chunk:
                p_t, p_x = cond, den
            elif dense:
                p_t[s : s + bc] = cond
                p_x[s : s + bc] = den
            else:
                p_t[s : s + bc, vc.unsqueeze(1), vt.unsqueeze(0)] = cond
                p_x[s : s + bc, vc] = den
        if self._floor_active:  # the predictive uses μ itself, the conditionals max(μ, floor)
            p_x = torch.zeros(b, co_n, dtype=DTYPE)
            p_x[:, vc] = w @ self._mu_flat[:, cols]
        return p_x.reshape(b, c_n, o_n), p_t.reshape(b, c_n, o_n, t_n, o_n)

    # ----- many respondents --------------------------------------------------
    def initial_batch(self, observed: Tensor) -> PersonaBatchState:
        """Batched priors conditioned on ``observed [B, I]`` (``-1`` = not observed)."""
        y = self.item_bank.check_responses(observed)
        onehot = one_hot_responses(y, self.item_bank)  # [B, I*O]
        log_post = normalise_log(self.log_prior.unsqueeze(0) + onehot @ self._log_lik_flat.T)
        return PersonaBatchState(log_post, y.clone())

    def to_batch(self, state: PersonaState) -> PersonaBatchState:
        """One respondent's state as a batch of one (same posterior, same observed answers)."""
        self._check_state(state)
        responses = torch.full((1, self.item_bank.n_items), MISSING, dtype=torch.long)
        for i, o in state.observed:
            responses[0, i] = o
        return PersonaBatchState(state.log_post.unsqueeze(0), responses)

    def branch_batch(
        self, state: PersonaBatchState, rows: Tensor, items: Tensor, options: Tensor
    ) -> PersonaBatchState:
        """Hypothetical continuations: output row ``r`` is respondent ``rows[r]`` after
        observing ``options[r]`` for ``items[r]`` (``-1``: no update), i.e.
        ``update_batch(select(state, rows), items, options)``. Used by multi-step lookahead.
        """
        self._check_batch(state)
        rows = torch.as_tensor(rows, dtype=torch.long).reshape(-1)
        sub = PersonaBatchState(state.log_post[rows], state.responses[rows])
        return self.update_batch(sub, items, options)

    def update_batch(
        self, state: PersonaBatchState, items: Tensor, options: Tensor
    ) -> PersonaBatchState:
        """Respondent ``b`` observes ``options[b]`` for ``items[b]``; ``-1`` skips (no change).

        Raises:
            ShapeError: ``items``/``options`` are not ``[B]``.
            UnknownItemError / InvalidOptionError: bad item or option (naming the row).
            ModelError: a respondent already has an answer to that item.
        """
        self._check_batch(state)
        b = state.batch_size
        items = torch.as_tensor(items).long().reshape(-1)
        options = torch.as_tensor(options).long().reshape(-1)
        if items.shape != (b,) or options.shape != (b,):
            raise ShapeError(
                f"items and options must have shape [{b}], got {list(items.shape)} and "
                f"{list(options.shape)}"
            )
        bad_i = (items < 0) | (items >= self.item_bank.n_items)
        if bool(bad_i.any()):
            r = int(bad_i.nonzero()[0])
            raise UnknownItemError(
                f"items[{r}] = {int(items[r])}: unknown item index "
                f"(the bank has {self.item_bank.n_items} items)"
            )
        limit = self._n_opt[items]
        bad_o = (options < MISSING) | (options >= limit)
        if bool(bad_o.any()):
            r = int(bad_o.nonzero()[0])
            raise InvalidOptionError(
                f"options[{r}] = {int(options[r])} is out of range for item "
                f"{self.item_bank.keys[int(items[r])]!r} ({int(limit[r])} options)"
            )
        take = options >= 0
        rows = torch.arange(b)
        again = take & (state.responses[rows, items] >= 0)
        if bool(again.any()):
            r = int(again.nonzero()[0])
            raise ModelError(
                f"respondent {r} already has an answer to item "
                f"{self.item_bank.keys[int(items[r])]!r}"
            )
        add = self._log_lik_t[items, options.clamp_min(0)]  # [B, K]
        log_post = torch.where(
            take.unsqueeze(1), normalise_log(state.log_post + add), state.log_post
        )
        responses = state.responses.clone()
        responses[rows[take], items[take]] = options[take]
        return PersonaBatchState(log_post, responses)

    def latent_posterior_batch(self, state: PersonaBatchState) -> Tensor:
        """``[B, K]`` posterior probabilities."""
        self._check_batch(state)
        return state.log_post.exp()

    def predict_batch(self, state: PersonaBatchState, items: Tensor | Sequence[int]) -> Tensor:
        """``[B, n, O]`` predictive distributions."""
        self._check_batch(state)
        idx = self._items(items)
        w = state.log_post.exp()
        n, o_n = int(idx.numel()), self.item_bank.max_options
        return (w @ self._mu_t[idx].reshape(n * o_n, -1).T).reshape(-1, n, o_n)

    def lookahead_batch(
        self,
        state: PersonaBatchState,
        candidates: Tensor | Sequence[int],
        targets: Tensor | Sequence[int],
    ) -> tuple[Tensor, Tensor]:
        """Batched :meth:`lookahead`: ``p_x [B, C, O]`` and ``p_t [B, C, O, T, O]``."""
        self._check_batch(state)
        cand = self._items(candidates)
        tgt = self._items(targets)
        return self._lookahead_core(state.log_post.exp(), cand, tgt)

    # ----- likelihoods (offline) --------------------------------------------
    def log_likelihood_matrix(self, responses: Tensor) -> Tensor:
        """``[N, K]``: ``Σ_{i observed} log max(μ[θ, i, y_ui], floor)`` per respondent and persona."""
        return one_hot_responses(responses, self.item_bank) @ self._log_lik_flat.T

    def log_marginal(self, responses: Tensor) -> Tensor:
        """``[N]``: ``log Σ_θ p(θ) Π_{i observed} μ[θ, i, y_ui]`` (floored)."""
        return torch.logsumexp(self.log_likelihood_matrix(responses) + self.log_prior, dim=1)

    # ----- serialisation ----------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "item_bank": self.item_bank.to_dict(),
            "mu": self.mu.clone(),
            "log_prior": self.log_prior.clone(),
            "floor": self.floor,
            "labels": list(self.labels) if self.labels is not None else None,
            "evidence": self.evidence.clone() if self.evidence is not None else None,
        }

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> PersonaMixture:
        return cls(
            ItemBank.from_dict(d["item_bank"]),
            d["mu"],
            d["log_prior"],
            floor=float(d.get("floor", DEFAULT_FLOOR)),
            labels=d.get("labels"),
            evidence=d.get("evidence"),
        )
