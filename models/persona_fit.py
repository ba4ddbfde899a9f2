"""Offline fits on a fixed persona dictionary ``μ [K, I, O]``: the prior and compression.

* :func:`fit_prior_em` — empirical-Bayes prior ``p(θ)`` by EM over historical respondents;
* :func:`compress` — drop personas with negligible prior and merge the rest into
  prototypes by prior-weighted k-means under the Jensen–Shannon distance
  (:func:`js_distance_matrix`) or the Hellinger distance
  (:func:`hellinger_distance_matrix`, one matrix product: what large dictionaries use);
* :func:`compress_for_live` — the live step's policy: a dictionary of more than
  :data:`LIVE_COMPRESS_ABOVE` personas is compressed to :data:`LIVE_PROTOTYPES`.

Example::

    log_prior, trace = fit_prior_em(mixture, responses)  # responses [N, I], -1 = missing
    small = compress(mixture.with_prior(log_prior), n_prototypes=64)

Pure numerics (torch, float64): no web framework, no settings.
"""

from __future__ import annotations

import math
import time

import torch
from torch import Tensor

from models.base import DTYPE, ItemBank, ModelError, ShapeError
from models.persona import DEFAULT_FLOOR, PersonaMixture, normalise_log


def fit_prior_em(
    mu: PersonaMixture | Tensor,
    responses: Tensor,
    *,
    item_bank: ItemBank | None = None,
    max_iter: int = 500,
    tol: float = 1e-8,
    floor: float = DEFAULT_FLOOR,
    base: Tensor | None = None,
    strength: float = 0.0,
) -> tuple[Tensor, list[float]]:
    """Empirical-Bayes persona prior by EM (docs/methods.md §1.3), optionally MAP under a
    Dirichlet prior centred on ``base``.

    With ``ℓ[u, θ] = Σ_{i observed} log max(μ[θ, i, y_ui], floor)``:

        E-step  γ[u, θ] ∝ p(θ) · exp(ℓ[u, θ])
        M-step  p(θ) = (Σ_u γ[u, θ] + s · b(θ)) / (N + s)

    with ``b = base`` (normalised; uniform when ``None``) and ``s = strength``, starting
    from ``b``. ``s = 0`` is maximum likelihood; ``s > 0`` is the posterior mode under a
    ``Dirichlet(1 + s · b)`` prior, i.e. ``b`` counts as ``s`` respondents: a few
    respondents move the weights a little, many move them to what they say, and no persona
    with ``b(θ) > 0`` reaches weight 0. Only non-missing entries count: callers mask the
    target columns (and any other held-out answers) to ``-1``. Each iteration increases
    the objective ``(1/N) Σ_u log Σ_θ p(θ) exp(ℓ[u, θ]) + (s/N) Σ_θ b(θ) log p(θ)``.

    Args:
        mu: a :class:`PersonaMixture` (its dictionary and floor are used, its prior ignored)
            or a ``[K, I, O]`` table (then ``item_bank`` is required).
        responses: ``LongTensor [N, I]``, ``-1`` = missing.
        max_iter: maximum EM iterations.
        tol: stop when the objective improves by less than ``tol``.
        base: ``[K]`` non-negative weights, the prior's centre and EM's start.
        strength: ``s >= 0``, the prior's weight in respondents.

    Returns:
        ``(log_prior [K], trace)`` where ``trace[t]`` is the objective under the prior
        after ``t`` M-steps (``trace[0]`` = the start ``b``; the last entry is the
        returned prior's); with ``s = 0`` it is the mean log marginal likelihood.

    Example: 2 respondents cannot zero a persona the base gives a third of the weight::

        lp, _ = fit_prior_em(m, y[:2], base=torch.tensor([1.0, 1.0, 1.0]), strength=10.0)
        # every lp.exp() >= 10 * (1/3) / (2 + 10) = 0.28
    """
    if isinstance(mu, PersonaMixture):
        model = mu
    else:
        if item_bank is None:
            raise ModelError("fit_prior_em: item_bank is required when mu is a tensor")
        model = PersonaMixture(item_bank, mu, floor=floor)
    ll = model.log_likelihood_matrix(responses)  # [N, K]
    n, k = ll.shape
    if n == 0:
        raise ShapeError("fit_prior_em: responses has no rows")
    if strength < 0 or not math.isfinite(strength):
        raise ModelError(f"fit_prior_em: strength must be a finite number >= 0, got {strength}")
    if base is None:
        b = torch.full((k,), 1.0 / k, dtype=DTYPE)
    else:
        b = torch.as_tensor(base, dtype=DTYPE)
        if b.shape != (k,) or not bool(torch.isfinite(b).all()) or bool((b < 0).any()):
            raise ModelError(f"fit_prior_em: base must be [{k}] finite weights >= 0")
        if float(b.sum()) <= 0:
            raise ModelError("fit_prior_em: base has no positive weight")
        b = b / b.sum()
    log_prior = torch.where(b > 0, b.clamp_min(1e-300).log(), torch.full_like(b, -math.inf))
    penalty_of = b > 0 if strength > 0 else torch.zeros(k, dtype=torch.bool)
    trace: list[float] = []
    for _ in range(max_iter + 1):
        joint = ll + log_prior  # [N, K]
        log_z = torch.logsumexp(joint, dim=1, keepdim=True)
        penalty = float((b[penalty_of] * log_prior[penalty_of]).sum()) * strength / n
        trace.append(float(log_z.mean()) + penalty)
        if len(trace) > 1 and trace[-1] - trace[-2] < tol:
            break
        if len(trace) == max_iter + 1:
            break
        gamma = (joint - log_z).exp()  # [N, K]
        prior = (gamma.sum(0) + strength * b) / (n + strength)
        log_prior = torch.where(
            prior > 0, prior.clamp_min(1e-300).log(), torch.full_like(prior, -math.inf)
        )
    return normalise_log(log_prior), trace


# ---------------------------------------------------------------------------
# Compression
# ---------------------------------------------------------------------------


def _entropy_rows(p: Tensor) -> Tensor:
    """Entropy over the last axis with ``0 log 0 = 0``."""
    return -(p * p.clamp_min(1e-300).log()).sum(-1)


def js_distance_matrix(a: Tensor, b: Tensor, *, chunk_elems: int = 1 << 20) -> Tensor:
    """Jensen–Shannon distance between persona tables, averaged over items.

    ``d(a_m, b_n) = sqrt( (1/I) Σ_i JS(a[m, i], b[n, i]) )`` with
    ``JS(p, q) = H((p + q)/2) − (H(p) + H(q))/2`` (natural log, so ``0 <= JS <= log 2``).
    With ``s = p + q`` (``Σ s = 2`` per item): ``H((p+q)/2) = log 2 − ½ Σ s log s``, so each
    pair costs one add and one ``x log x`` per entry.

    Args:
        a: ``[M, I, O]`` distributions. b: ``[N, I, O]`` distributions.

    Returns:
        ``[M, N]`` distances.
    """
    m, i_n, o_n = a.shape
    n = b.shape[0]
    a2 = a.reshape(m, i_n * o_n)
    b2 = b.reshape(n, i_n * o_n)
    ha = _entropy_rows(a).sum(1)  # [M]
    hb = _entropy_rows(b).sum(1)  # [N]
    out = torch.empty(m, n, dtype=DTYPE)
    step = max(1, chunk_elems // max(1, n * i_n * o_n))
    for s in range(0, m, step):
        pair = a2[s : s + step].unsqueeze(1) + b2.unsqueeze(0)  # [m, N, I*O]
        slogs = torch.xlogy(pair, pair).sum(-1)  # Σ_i Σ_k s log s
        hm = i_n * math.log(2.0) - 0.5 * slogs
        js = hm - 0.5 * (ha[s : s + step].unsqueeze(1) + hb.unsqueeze(0))
        out[s : s + step] = (js.clamp_min(0) / i_n).sqrt()
    return out


def hellinger_distance_matrix(a: Tensor, b: Tensor) -> Tensor:
    """Hellinger distance between persona tables, averaged over items.

    ``d(a_m, b_n) = sqrt( (1/I) Σ_i H²(a[m, i], b[n, i]) )`` with
    ``H²(p, q) = 1 − Σ_k sqrt(p_k q_k)`` (``0 <= H² <= 1``), so
    ``d² = 1 − (1/I) · sqrt(a) · sqrt(b)ᵀ``: one ``[M, I·O] @ [I·O, N]`` product instead
    of :func:`js_distance_matrix`'s ``x log x`` per entry and pair (at 20,000 personas
    x 91 four-option items and 500 prototypes: well under a second per k-means pass on
    one core, against about 27 s for JS, extrapolated from 0.54 s for 2,000 x 100). Like JS, it is a bounded f-divergence that is 0 exactly when the tables agree.

    Args:
        a: ``[M, I, O]`` distributions. b: ``[N, I, O]`` distributions.

    Returns:
        ``[M, N]`` distances.
    """
    i_n = a.shape[1]
    sa = a.clamp_min(0).sqrt().reshape(a.shape[0], -1)
    sb = b.clamp_min(0).sqrt().reshape(b.shape[0], -1)
    return (1 - sa @ sb.T / i_n).clamp_min(0).sqrt()


DISTANCES = {"js": js_distance_matrix, "hellinger": hellinger_distance_matrix}
"""The distances :func:`compress` can cluster with."""

LIVE_COMPRESS_ABOVE = 2_000
"""A persona prior with more personas than this is compressed for the live step."""

LIVE_PROTOTYPES = 500
"""Prototypes of a compressed live persona prior: the 500 of the persona paper
(docs/methods.md [1], §1.4); a live step on them stays under 2 ms CPU (p99) on one core
(docs/personas.md)."""


def compress_for_live(
    mixture: PersonaMixture,
    *,
    above: int = LIVE_COMPRESS_ABOVE,
    n_prototypes: int = LIVE_PROTOTYPES,
    seed: int = 0,
) -> PersonaMixture:
    """The mixture the live step uses: ``mixture`` itself up to ``above`` personas, else
    :func:`compress` to ``n_prototypes`` under the Hellinger distance (20 k-means passes
    at most). The compressed model's ``metrics`` gain ``compressed_from``,
    ``n_prototypes`` and ``compression_seconds``; its labels are ``prototype-1``, ...

    Example: 20,000 personas → 500 prototypes whose priors sum to 1.
    """
    if mixture.n_personas <= above:
        return mixture
    t0 = time.thread_time()
    out = compress(mixture, n_prototypes, seed=seed, metric="hellinger", max_iter=20)
    out.metrics["compression_seconds"] = round(time.thread_time() - t0, 3)
    return out


def compress(
    mixture: PersonaMixture,
    n_prototypes: int,
    *,
    min_prior: float = 1e-5,
    seed: int = 0,
    max_iter: int = 50,
    metric: str = "js",
) -> PersonaMixture:
    """Merge personas into prototypes (docs/methods.md §1, "compression").

    1. Drop personas with prior ``< min_prior`` (the rest are renormalised).
    2. If at most ``n_prototypes`` remain, return them unchanged (same predictive).
    3. Otherwise prior-weighted k-means under ``metric`` (``"js"``:
       :func:`js_distance_matrix`, as in docs/methods.md [1]; ``"hellinger"``:
       :func:`hellinger_distance_matrix`): seeds by prior-weighted k-means++; assign each
       persona to its nearest prototype; each prototype's table is the prior-weighted mean
       of its members' distributions and its prior the sum of its members' priors. Stops
       when assignments no longer change, or after ``max_iter`` passes.

    Returns:
        A new :class:`PersonaMixture` with at most ``n_prototypes`` personas and total prior
        mass 1. ``metrics["compressed_from"]`` records the original ``K``.
    """
    if n_prototypes < 1:
        raise ModelError(f"n_prototypes must be >= 1, got {n_prototypes}")
    if metric not in DISTANCES:
        raise ModelError(f"unknown compression metric {metric!r} ({', '.join(DISTANCES)})")
    prior = mixture.log_prior.exp()
    keep = (prior >= min_prior) & (prior > 0)
    if not bool(keep.any()):
        raise ModelError(f"no persona has prior >= min_prior={min_prior}")
    mu = mixture.mu[keep]
    w = prior[keep] / prior[keep].sum()
    labels = (
        [lab for lab, kp in zip(mixture.labels, keep.tolist(), strict=True) if kp]
        if mixture.labels is not None
        else None
    )
    k = int(mu.shape[0])
    if k <= n_prototypes:
        out = PersonaMixture(mixture.item_bank, mu, w.log(), floor=mixture.floor, labels=labels)
        out.metrics = {"compressed_from": mixture.n_personas, "n_prototypes": k}
        return out
    if metric == "hellinger":  # sqrt(μ) once, then one matrix product per call
        i_n = mu.shape[1]
        root = mu.sqrt().reshape(k, -1)

        def to_all(tables: Tensor) -> Tensor:
            t = tables.sqrt().reshape(tables.shape[0], -1)
            return (1 - root @ t.T / i_n).clamp_min(0).sqrt()
    else:

        def to_all(tables: Tensor) -> Tensor:
            return js_distance_matrix(mu, tables)

    gen = torch.Generator().manual_seed(seed)
    # k-means++ seeding, weighted by the prior.
    centres = [int(torch.multinomial(w, 1, generator=gen))]
    d2 = to_all(mu[centres[-1]].unsqueeze(0))[:, 0] ** 2
    for _ in range(1, n_prototypes):
        p = w * d2
        if float(p.sum()) <= 0:
            rest = [j for j in range(k) if j not in set(centres)]
            centres.append(rest[int(torch.randint(len(rest), (1,), generator=gen))])
        else:
            centres.append(int(torch.multinomial(p / p.sum(), 1, generator=gen)))
        d2 = torch.minimum(d2, to_all(mu[centres[-1]].unsqueeze(0))[:, 0] ** 2)
    cent = mu[centres].clone()  # [P, I, O]
    assign = torch.full((k,), -1, dtype=torch.long)
    for _ in range(max_iter):
        dist = to_all(cent)  # [K, P]
        new = dist.argmin(1)
        # An empty prototype takes the persona farthest from its own prototype.
        counts = torch.bincount(new, minlength=n_prototypes)
        for p_idx in (counts == 0).nonzero().flatten().tolist():
            far = int((dist[torch.arange(k), new] * (counts[new] > 1)).argmax())
            counts[new[far]] -= 1
            new[far] = p_idx
            counts[p_idx] = 1
        if bool((new == assign).all()):
            break
        assign = new
        mass = torch.zeros(n_prototypes, dtype=DTYPE).index_add_(0, assign, w)
        cent = torch.zeros_like(cent).index_add_(0, assign, w.view(-1, 1, 1) * mu)
        cent = cent / mass.view(-1, 1, 1)
    mass = torch.zeros(n_prototypes, dtype=DTYPE).index_add_(0, assign, w)
    cent = torch.zeros_like(cent).index_add_(0, assign, w.view(-1, 1, 1) * mu) / mass.view(-1, 1, 1)
    out = PersonaMixture(
        mixture.item_bank,
        cent,
        mass.log(),
        floor=mixture.floor,
        labels=[f"prototype-{j + 1}" for j in range(n_prototypes)],
    )
    out.metrics = {
        "compressed_from": mixture.n_personas,
        "n_prototypes": n_prototypes,
        "metric": metric,
    }
    return out
