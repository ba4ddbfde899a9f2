"""Data-fitted personas: a latent class model fitted by EM, returned as a persona mixture.

The latent class model (a finite mixture of independent categoricals; Lazarsfeld &
Henry 1968; Goodman 1974) is exactly the persona mixture of :mod:`models.persona` with
``μ`` and ``p(θ)`` fitted to a response matrix instead of elicited from a language model:

    p(y_u) = Σ_θ π_θ Π_{i observed} μ[θ, i, y_ui]

Missing answers (``-1``) are integrated out (they simply drop from the product), so
respondents with partial answers are used as they are. Attributes (demographics) are
just items of the mixture.

Fitting is maximum a posteriori EM with a ``Dirichlet`` prior on every ``μ[θ, i, :]``
whose pseudo-counts are ``a[i, k] = α O_i b[i, k]``: ``α`` per option spread over the
``O_i`` options of item ``i`` in proportion to a base distribution ``b[i, :]``, uniform by
default ("Dirichlet smoothing", ``a = α``):

    E-step  γ[u, θ] ∝ π_θ Π_{i observed} μ[θ, i, y_ui]
    M-step  μ[θ, i, k] = (Σ_u γ[u, θ] 1[y_ui = k] + a[i, k]) / (Σ_u γ[u, θ] 1[y_ui ≠ −1] + α O_i)
            π_θ = (1/N) Σ_u γ[u, θ]

An item no respondent answered gets ``μ[θ, i, :] = b[i, :]`` in every class: with the
population predictive of a persona prior as ``b`` (:func:`fit_latent_classes`'s ``base``),
what the language model said about an item nobody has answered yet is kept.

Each iteration increases the penalised log-likelihood
``F = Σ_u log p(y_u) + Σ_{θ, i, k < O_i} a[i, k] log μ[θ, i, k]`` (Dempster, Laird & Rubin
1977), recorded per iteration (divided by ``N``). The number of classes is chosen from a
candidate list by the validation users' mean log-likelihood; several random restarts per
candidate keep the best penalised fit.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from models.base import DTYPE, ItemBank, ModelError, ShapeError, responses_hash
from models.persona import PersonaMixture

DEFAULT_N_CLASSES: tuple[int, ...] = (4, 8, 16, 32, 48, 64)
DEFAULT_RESTARTS = 3
"""The default fit (classes tried, restarts per K): the benchmark's ``default`` and a live
study's model both use these, so the benchmark measures what the app serves."""


@dataclass
class LatentClassFit:
    """One EM run.

    Attributes:
        mu: ``[K, I, O]`` answer distributions.
        log_prior: ``[K]`` log class weights.
        trace: penalised log-likelihood ``F / N`` before each M-step and after the last
            one (non-decreasing).
        converged: whether the tolerance was reached before ``max_iter``.
        evidence: ``[K, I]`` answers behind each ``μ[θ, i, :]`` in the last M-step,
            ``Σ_u γ[u, θ] 1[y_ui ≠ −1]`` (summed over the classes: the item's answer count).
    """

    mu: Tensor
    log_prior: Tensor
    trace: list[float] = field(default_factory=list)
    converged: bool = False
    evidence: Tensor | None = None

    @property
    def objective(self) -> float:
        return self.trace[-1] if self.trace else -math.inf


class _Encoded:
    """A response matrix as sparse one-hot matrices (built once per data set).

    ``y [N, I*O]`` (CSR, a 1 at column ``i*O + y_ui`` for every observed answer) and its
    transpose ``yt [I*O, N]``: the E-step is ``y @ log μ^T`` and the M-step ``yt @ γ``,
    both ``O(nnz · K)`` instead of ``O(N · I · O · K)``.
    """

    def __init__(self, responses: Tensor, item_bank: ItemBank) -> None:
        y = item_bank.check_responses(responses)
        n, i_n = y.shape
        o_n = item_bank.max_options
        obs = y >= 0
        cols = (torch.arange(i_n) * o_n).unsqueeze(0) + y.clamp_min(0)
        col = cols[obs]  # row-major order: CSR order
        crow = torch.cat([torch.zeros(1, dtype=torch.long), obs.sum(1).cumsum(0)])
        vals = torch.ones(col.numel(), dtype=DTYPE)
        with warnings.catch_warnings():  # torch warns that sparse CSR is "beta"
            warnings.simplefilter("ignore", UserWarning)
            self.y = torch.sparse_csr_tensor(crow, col, vals, (n, i_n * o_n))
            self.yt = self.y.to_sparse_coo().t().to_sparse_csr()
        self.n = n
        self.valid = item_bank.option_mask()


def pseudo_counts(valid: Tensor, alpha: float, base: Tensor | None = None) -> Tensor:
    """The Dirichlet pseudo-counts ``a [I, O]`` of the M-step: ``α`` on every valid option,
    or with ``base [I, O]`` (a distribution over each item's options) ``α O_i b[i, k]``.

    Example: ``valid = [[True, True, False]]``, ``α = 0.5``, ``b = [[0.9, 0.1, 0]]`` gives
    ``a = [[0.9, 0.1, 0]]`` (``α O_i = 1``); without ``b``, ``[[0.5, 0.5, 0]]``.
    """
    mask = valid.to(DTYPE)
    if base is None:
        return alpha * mask
    if base.shape != valid.shape:
        raise ShapeError(f"base must be [I, O] = {tuple(valid.shape)}, got {tuple(base.shape)}")
    b = base.to(DTYPE) * mask
    ones = torch.ones(b.shape[0], dtype=DTYPE)
    if bool((b < 0).any()) or not torch.allclose(b.sum(-1), ones, atol=1e-6):
        raise ModelError("base must be a distribution over each item's options")
    return alpha * mask.sum(-1, keepdim=True) * b


def _m_step(gamma: Tensor, enc: _Encoded, pseudo: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """MAP M-step from responsibilities ``gamma [N, K]`` and pseudo-counts ``pseudo [I, O]``;
    returns ``(mu [K, I, O], log_pi [K], evidence [K, I])``, ``evidence[θ, i] =
    Σ_u γ[u, θ] 1[y_ui ≠ −1]`` (see :attr:`LatentClassFit.evidence`)."""
    i_n, o_n = enc.valid.shape
    k = gamma.shape[1]
    answers = (enc.yt @ gamma).T.reshape(k, i_n, o_n) * enc.valid  # [K, I, O]
    counts = (answers + pseudo) * enc.valid
    n_obs = counts.sum(-1, keepdim=True)  # Σ_u γ[u, θ] 1[observed] + α O_i
    mu = counts / n_obs.clamp_min(1e-300)
    pi = gamma.mean(0)
    log_pi = torch.where(pi > 0, pi.clamp_min(1e-300).log(), torch.full_like(pi, -math.inf))
    return mu, log_pi, answers.sum(-1)


def _penalised(enc: _Encoded, mu: Tensor, log_pi: Tensor, pseudo: Tensor) -> tuple[Tensor, Tensor]:
    """``(F / N, log joint [N, K])`` for the current parameters."""
    k = mu.shape[0]
    log_mu = torch.where(enc.valid, mu.clamp_min(1e-300).log(), torch.zeros((), dtype=DTYPE))
    joint = enc.y @ log_mu.reshape(k, -1).T + log_pi  # [N, K]
    ll = torch.logsumexp(joint, dim=1).sum()
    penalty = (pseudo * log_mu).sum()
    return (ll + penalty) / enc.n, joint


def fit_em(
    responses: Tensor | _Encoded,
    item_bank: ItemBank,
    n_classes: int,
    *,
    alpha: float = 0.5,
    max_iter: int = 300,
    tol: float = 1e-6,
    seed: int = 0,
    base: Tensor | None = None,
) -> LatentClassFit:
    """One MAP-EM run from random responsibilities (``γ[u] ~ Dirichlet(1)``).

    Args:
        responses: ``LongTensor [N, I]`` (``-1`` = missing).
        n_classes: ``K``.
        alpha: Dirichlet pseudo-count per option (``> 0`` keeps every ``μ`` positive).
        max_iter: maximum number of EM iterations.
        tol: stop when ``F / N`` improves by less than ``tol``.
        seed: seed of the random start.
        base: ``[I, O]`` base distribution of the pseudo-counts (:func:`pseudo_counts`);
            ``None``: uniform.
    """
    if n_classes < 1:
        raise ModelError(f"n_classes must be >= 1, got {n_classes}")
    if alpha < 0:
        raise ModelError(f"alpha must be >= 0, got {alpha}")
    enc = responses if isinstance(responses, _Encoded) else _Encoded(responses, item_bank)
    if enc.n == 0:
        raise ShapeError("responses has no rows")
    pseudo = pseudo_counts(enc.valid, alpha, base)
    gen = torch.Generator().manual_seed(seed)
    e = -torch.rand(enc.n, n_classes, generator=gen, dtype=DTYPE).clamp_min(1e-12).log()
    gamma = e / e.sum(1, keepdim=True)
    mu, log_pi, evidence = _m_step(gamma, enc, pseudo)
    fit = LatentClassFit(mu, log_pi)
    for _ in range(max_iter):
        obj, joint = _penalised(enc, mu, log_pi, pseudo)
        fit.trace.append(float(obj))
        if len(fit.trace) > 1 and fit.trace[-1] - fit.trace[-2] < tol:
            fit.converged = True
            break
        gamma = (joint - torch.logsumexp(joint, dim=1, keepdim=True)).exp()
        mu, log_pi, evidence = _m_step(gamma, enc, pseudo)
    else:
        fit.trace.append(float(_penalised(enc, mu, log_pi, pseudo)[0]))
    fit.mu, fit.log_prior, fit.evidence = mu, log_pi, evidence
    return fit


def mean_log_likelihood(model: PersonaMixture, responses: Tensor) -> float:
    """Mean over respondents of ``log p(y_u)`` (observed entries only)."""
    return float(model.log_marginal(responses).mean())


def fit_independent(
    responses: Tensor, item_bank: ItemBank, *, alpha: float = 0.5
) -> PersonaMixture:
    """The independent-marginals model (one class): a baseline for the latent class fit."""
    fit = fit_em(responses, item_bank, 1, alpha=alpha, max_iter=2)
    return PersonaMixture(item_bank, fit.mu, fit.log_prior, evidence=fit.evidence)


def _restarts(
    data: Tensor,
    item_bank: ItemBank,
    k: int,
    n_restarts: int,
    alpha: float,
    max_iter: int,
    tol: float,
    seed: int,
    on_fit: Callable[[int, int], None] | None = None,
    base: Tensor | None = None,
) -> list[LatentClassFit]:
    """``n_restarts`` EM fits of ``k`` classes on ``data`` (restart ``r``: seed
    ``seed + 1000 k + r``); ``on_fit(k, r)`` is called after each."""
    enc = _Encoded(data, item_bank)
    fits = []
    for r in range(n_restarts):
        fits.append(
            fit_em(
                enc,
                item_bank,
                k,
                alpha=alpha,
                max_iter=max_iter,
                tol=tol,
                seed=seed + 1000 * k + r,
                base=base,
            )
        )
        if on_fit is not None:
            on_fit(k, r)
    return fits


def _best(runs: Sequence[LatentClassFit]) -> LatentClassFit:
    """The fit with the highest penalised log-likelihood (the first on ties)."""
    return max(runs, key=lambda f: f.objective)


def _selection_score(
    model: PersonaMixture, k: int, y: Tensor, yv: Tensor | None, item_bank: ItemBank
) -> float:
    """Mean validation log-likelihood per user, or without validation data
    ``-BIC / N`` on the training data ``y [N, I]`` (``k`` classes)."""
    if yv is not None:
        return mean_log_likelihood(model, yv)
    n_params = (k - 1) + k * sum(o - 1 for o in item_bank.n_options)
    ll = float(model.log_marginal(y).sum())
    return -(-2 * ll + n_params * math.log(y.shape[0])) / y.shape[0]


def _structure_parts(
    structure: str, chosen: int, runs_by_k: dict[int, list[LatentClassFit]]
) -> list[LatentClassFit]:
    """The fits of the chosen structure: the best restart of ``chosen`` classes
    (``single``), all its restarts (``restarts``) or every fit (``all``)."""
    if structure == "single":
        return [_best(runs_by_k[chosen])]
    if structure == "restarts":
        return runs_by_k[chosen]
    return [f for runs in runs_by_k.values() for f in runs]


def _fit_metrics(
    out: PersonaMixture,
    parts: Sequence[LatentClassFit],
    structure: str,
    chosen: int,
    scores: dict[tuple[str, int], float],
    by_k: dict[int, float],
    y: Tensor,
    yv: Tensor | None,
    data: Tensor,
    alpha: float,
    n_restarts: int,
    refit_with_validation: bool,
    item_bank: ItemBank,
) -> dict[str, object]:
    """The ``metrics`` of :func:`fit_latent_classes`'s mixture ``out`` of the fits
    ``parts`` (see its Returns)."""
    main = _best(parts)
    metrics: dict[str, object] = {
        "model": "latent_class",
        "n_classes": out.n_personas,
        "structure": structure,
        "classes_per_fit": [int(f.mu.shape[0]) for f in parts],
        "selection": "validation_log_lik" if yv is not None else "bic",
        "alpha": alpha,
        "n_restarts": n_restarts,
        "train_trace": main.trace,
        "converged": all(f.converged for f in parts),
        "fit_users": int(data.shape[0]),
        "refit_with_validation": bool(refit_with_validation and yv is not None),
    }
    if yv is not None:
        metrics["val_log_lik"] = scores[(structure, chosen)]
        metrics["val_log_lik_by_k"] = {str(k): v for k, v in by_k.items()}
        metrics["val_log_lik_by_structure"] = {
            f"{name}:{k}" if name != "all" else "all": v for (name, k), v in scores.items()
        }
        metrics["val_log_lik_independent"] = mean_log_likelihood(
            fit_independent(y, item_bank, alpha=alpha), yv
        )
    else:
        metrics["bic_score_by_k"] = {str(k): v for k, v in by_k.items()}
    return metrics


def _search_structures(
    cands: list[int],
    fit_runs: Callable[[Tensor, int], list[LatentClassFit]],
    score: Callable[[PersonaMixture, int], float],
    item_bank: ItemBank,
    y: Tensor,
    n_restarts: int,
    patience: int | None,
    ensemble: bool,
) -> tuple[dict[int, list[LatentClassFit]], dict[tuple[str, int], float], dict[int, float]]:
    """Fit each ``K`` of ``cands`` on ``y`` and score the candidate structures:
    ``(fits by K, score by (structure, K), score of the best single fit by K)``;
    ``ensemble``: also the averaged structures (needs validation data)."""
    # Candidate structures: ("single", K) = the best restart of K classes;
    # ("restarts", K) = all restarts of K, averaged; ("all", 0) = every fit, averaged.
    runs_by_k: dict[int, list[LatentClassFit]] = {}
    scores: dict[tuple[str, int], float] = {}
    by_k: dict[int, float] = {}
    since_best = 0
    for k in cands:
        if patience is not None and since_best >= patience:
            break
        runs = fit_runs(y, k)
        runs_by_k[k] = runs
        by_k[k] = score(_mixture([_best(runs)], item_bank), k)
        scores[("single", k)] = by_k[k]
        if ensemble and n_restarts > 1:
            scores[("restarts", k)] = score(_mixture(runs, item_bank), k)
        k_best = max(by_k[k], scores.get(("restarts", k), -math.inf))
        since_best = 0 if k_best >= max(scores.values()) else since_best + 1
    if ensemble and len(runs_by_k) * n_restarts > 1:
        scores[("all", 0)] = score(
            _mixture([f for runs in runs_by_k.values() for f in runs], item_bank), 0
        )
    return runs_by_k, scores, by_k


def _fit_inputs(
    responses: Tensor,
    val_responses: Tensor | None,
    item_bank: ItemBank,
    n_classes: Sequence[int],
    n_restarts: int,
) -> tuple[Tensor, Tensor | None, list[int]]:
    """Checked ``(y, yv, cands)`` of :func:`fit_latent_classes`.

    ``y`` the training responses ``[N, I]``; ``yv`` the validation responses, ``None``
    when absent or empty; ``cands`` the distinct candidate ``K`` in increasing order with
    ``K <= N`` (``[1]`` when none is).

    Raises:
        ModelError: a candidate ``K < 1``, no candidate, or ``n_restarts < 1``.
        ShapeError, InvalidOptionError: responses that do not fit ``item_bank``.
    """
    y = item_bank.check_responses(responses)
    cands = sorted({int(k) for k in n_classes})
    if not cands or cands[0] < 1:
        raise ModelError(f"n_classes must be positive integers, got {list(n_classes)}")
    if n_restarts < 1:
        raise ModelError(f"n_restarts must be >= 1, got {n_restarts}")
    cands = [k for k in cands if k <= y.shape[0]] or [1]
    yv = item_bank.check_responses(val_responses) if val_responses is not None else None
    if yv is not None and yv.shape[0] == 0:
        yv = None
    return y, yv, cands


@dataclass
class _RestartProgress:
    """The ``on_fit(k, r)`` callback of :func:`_restarts`: reports to ``progress``.

    After restart ``r`` of candidate ``k`` (position ``i`` in ``stage_ks``) the fraction
    done is ``start + span * (i * R + r + 1) / (len(stage_ks) * R)`` with
    ``R = n_restarts``; the message names the stage, ``k`` and the restart. The stage
    fields are reassigned when the search moves on to the refit.
    """

    progress: Callable[[float, str], None] | None
    n_restarts: int
    stage: str
    start: float
    span: float
    stage_ks: list[int]

    def __call__(self, k: int, r: int) -> None:
        if self.progress is None:
            return
        stage_ks, n_restarts = self.stage_ks, self.n_restarts
        i = stage_ks.index(k) if k in stage_ks else 0
        done = (i * n_restarts + r + 1) / (len(stage_ks) * n_restarts)
        self.progress(
            self.start + self.span * done,
            f"{self.stage}: {k} classes ({i + 1} of {len(stage_ks)}), "
            f"restart {r + 1} of {n_restarts}",
        )


def fit_latent_classes(
    responses: Tensor,
    item_bank: ItemBank,
    *,
    val_responses: Tensor | None = None,
    n_classes: Sequence[int] = DEFAULT_N_CLASSES,
    alpha: float = 0.5,
    n_restarts: int = DEFAULT_RESTARTS,
    max_iter: int = 300,
    tol: float = 1e-5,
    refit_with_validation: bool = True,
    patience: int | None = 2,
    ensemble: bool = True,
    seed: int = 0,
    progress: Callable[[float, str], None] | None = None,
    base: Tensor | None = None,
) -> PersonaMixture:
    """Fit latent classes, choosing ``K`` on validation log-likelihood; a persona mixture.

    For each ``K`` in ``n_classes`` (``K <= N``), ``n_restarts`` EM runs on ``responses``.
    Candidates: the best restart of each ``K`` and, with ``ensemble``, the equal-weight
    average of a ``K``'s restarts and of every fit tried; the highest mean validation
    log-likelihood wins. With ``refit_with_validation`` the winner's fits are then redone
    on training and validation users together (more data, same structure and seeds).
    Without validation data the best single fit by BIC on the training data is returned.

    Args:
        responses: training ``LongTensor [N, I]`` (``-1`` = missing).
        item_bank: the items (attributes are items too).
        val_responses: validation ``[N_val, I]`` or ``None``.
        n_classes: candidate numbers of classes.
        alpha: Dirichlet pseudo-count per option.
        n_restarts: random restarts per candidate.
        max_iter, tol: EM stopping rule (see :func:`fit_em`).
        refit_with_validation: refit the chosen ``K`` on train + validation users.
        patience: stop trying larger ``K`` after this many candidates in a row without a
            better score (``None``: try them all). Saves the most expensive fits once the
            validation likelihood has turned down.
        ensemble: also consider, on validation log-likelihood, the equal-weight average of
            all restarts of one ``K`` and of every fit tried (see :func:`_mixture`); the
            average of mixtures is again a persona mixture. Needs validation data.
        seed: base seed (restart ``r`` of candidate ``K`` uses ``seed + 1000 K + r``).
        progress: called after each EM restart with the fraction done in ``[0, 1]`` and a
            message, e.g. ``(0.25, "K grid: 8 classes (2 of 4), restart 1 of 2")``; the
            search over ``K`` is the first 80%, the refit the rest (the search may stop
            early, see ``patience``). Does not change the fit.
        base: ``[I, O]`` base distribution of the Dirichlet pseudo-counts
            (:func:`pseudo_counts`), e.g. a persona prior's population predictive; an item
            without answers then keeps it. ``None``: uniform.

    Returns:
        A :class:`PersonaMixture` (family ``persona_mixture``) with ``metrics``:
        ``n_classes`` (classes in the returned mixture), ``structure`` (``single``,
        ``restarts`` or ``all``), ``classes_per_fit``, ``val_log_lik`` (mean per validation
        user, from the train-only fits), ``val_log_lik_by_k`` (best single fit per ``K``),
        ``val_log_lik_by_structure``, ``val_log_lik_independent``, ``train_trace`` (the
        per-iteration penalised log-likelihood of the best component fit), ``fit_users``; and
        ``training_hash`` of the data it was fitted on.
    """
    y, yv, cands = _fit_inputs(responses, val_responses, item_bank, n_classes, n_restarts)
    on_fit = _RestartProgress(progress, n_restarts, "K grid", 0.0, 0.8, cands)

    def fit_runs(data: Tensor, k: int) -> list[LatentClassFit]:
        return _restarts(data, item_bank, k, n_restarts, alpha, max_iter, tol, seed, on_fit, base)

    def score(model: PersonaMixture, k: int) -> float:
        return _selection_score(model, k, y, yv, item_bank)

    runs_by_k, scores, by_k = _search_structures(
        cands, fit_runs, score, item_bank, y, n_restarts, patience, ensemble and yv is not None
    )
    structure, chosen = max(scores, key=lambda key: scores[key])
    data = y
    if refit_with_validation and yv is not None:
        data = torch.cat([y, yv])
        needed = list(runs_by_k) if structure == "all" else [chosen]
        on_fit.stage, on_fit.start, on_fit.span = "refit with validation users", 0.8, 0.2
        on_fit.stage_ks = needed
        runs_by_k = {k: fit_runs(data, k) for k in needed}
    parts = _structure_parts(structure, chosen, runs_by_k)
    out = _mixture(parts, item_bank)
    out.training_hash = responses_hash(data, item_bank)
    if base is not None:
        digest = hashlib.sha256(base.to(DTYPE).contiguous().numpy().tobytes()).hexdigest()
        out.training_hash += f":base:{digest[:16]}"
    out.metrics = _fit_metrics(
        out,
        parts,
        structure,
        chosen,
        scores,
        by_k,
        y,
        yv,
        data,
        alpha,
        n_restarts,
        refit_with_validation,
        item_bank,
    )
    out.metrics["dirichlet_base"] = "given" if base is not None else "uniform"
    return out


def _mixture(fits: Sequence[LatentClassFit], item_bank: ItemBank) -> PersonaMixture:
    """Equal-weight average of fitted mixtures: one mixture with all their classes.

    ``p(y) = (1/R) Σ_r Σ_θ π_rθ Π μ_r[θ, ...]`` is itself a persona mixture with prior
    ``π_rθ / R``; its posterior re-weights the fits by how well each explains the answers
    (Bayesian model averaging with a uniform prior over the fits).
    """
    mu = torch.cat([f.mu for f in fits])
    log_prior = torch.cat([f.log_prior for f in fits]) - math.log(len(fits))
    evidence = [f.evidence for f in fits]
    if any(e is None for e in evidence):
        return PersonaMixture(item_bank, mu, log_prior)
    return PersonaMixture(item_bank, mu, log_prior, evidence=torch.cat(evidence))  # type: ignore[arg-type]
