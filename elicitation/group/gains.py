"""Member gains: what asking one member one question is expected to tell about its targets.

For member ``v`` with answers ``h_v``, candidate ``x`` and targets ``I*``, a gain is the
expected fall of a per-target uncertainty ``u`` (:data:`UNCERTAINTIES`):

    gain_v(x) = sum_t u(p(Y_vt | h_v)) - sum_k p(Y_vx = k | h_v) sum_t u(p(Y_vt | h_v, Y_vx = k))

(:func:`member_eig`), or its two-answer form (:func:`member_lookahead_accuracy_gain`).
Every function takes ``history [B, I]`` (``-1`` = no answer) and returns ``[B, C]``
float64 gains, one column per candidate; a member who already answered ``x`` gains 0.

Example::

    gain = member_eig(model, history, candidates=[0, 1, 2], targets=[5])  # [B, 3]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from elicitation.errors import GroupError
from models.base import DTYPE, MISSING, BeliefModel


def _entropy(p: Tensor) -> Tensor:
    return -torch.special.xlogy(p, p).sum(-1)


def _expected_error(p: Tensor) -> Tensor:
    return 1.0 - p.max(-1).values


def _quadratic(p: Tensor) -> Tensor:
    return 1.0 - (p * p).sum(-1)


UNCERTAINTIES: dict[str, Callable[[Tensor], Tensor]] = {
    "entropy": _entropy,
    "error": _expected_error,
    "quadratic": _quadratic,
}
"""Per-target uncertainty ``u(p)`` whose expected reduction a member gain measures:
``entropy`` (information gain, nats: the expected log-score gain), ``error``
(``1 - max_k p_k``, the chance the most likely answer is wrong: the gain is the expected
rise in target accuracy) or ``quadratic`` (``1 - sum_k p_k^2``: the gain is the expected
fall of the Brier score, proper like the log score but bounded)."""

LOOKAHEAD = "error_lookahead"
"""The gain name of :func:`member_lookahead_accuracy_gain` in :meth:`RoundContext.gains`
(not a per-target uncertainty: it depends on the later questions and their chance)."""

LOOKAHEAD_TOP = "error_lookahead_top"
"""The gain name of :func:`member_lookahead_accuracy_gain` with each member's
:data:`LOOKAHEAD_SECOND` best second questions only (``max_later``)."""


def member_eig(
    model: BeliefModel,
    history: Tensor,
    candidates: Sequence[int],
    targets: Sequence[int],
    *,
    chunk: int = 8192,
    uncertainty: str = "entropy",
) -> Tensor:
    """Expected information gain of each candidate about each member's targets.

    ``EIG_v(x) = sum_t H(p(Y_vt | h_v)) - sum_k p(Y_vx = k | h_v) sum_t H(p(Y_vt | h_v, Y_vx = k))``
    (nats; the sum of target entropies approximates ``H(U_v)`` as in docs/methods.md [3]). With
    ``uncertainty="error"`` the entropy ``H`` is replaced by ``1 - max_k p_k``: the
    gain is then the expected rise in the number of targets whose most likely answer is
    right (the value of the answer under 0-1 loss, >= 0 by Jensen).
    Computed with the batched interface every belief model has: one ``update_batch``
    and one ``predict_batch`` per (candidate, option) for all members at once, so the
    cost is ``sum_x O_x`` batched updates, whatever the model family. A member who has
    already answered ``x`` gains nothing from it (``EIG_v(x) = 0``).

    Args:
        model: belief model (``initial_batch``, ``update_batch``, ``predict_batch``).
        history: ``[B, I]`` each member's answers so far (``-1`` none); states are
            rebuilt from it in chunks (a state equals the replay of its answers).
        candidates: ``C`` item indices.
        targets: ``T`` target item indices.
        chunk: members per batch.

    Returns:
        ``[B, C]`` float64, >= 0 up to rounding.
    """
    if uncertainty not in UNCERTAINTIES:
        raise GroupError(f"unknown uncertainty {uncertainty!r} (known: {sorted(UNCERTAINTIES)})")
    u = UNCERTAINTIES[uncertainty]
    cand = [int(c) for c in candidates]
    tgt = [int(t) for t in targets]
    n_opt = model.item_bank.n_options
    o_t = max((n_opt[t] for t in tgt), default=1)
    parts = []
    for s in range(0, int(history.shape[0]), chunk):
        hist = history[s : s + chunk]
        b = int(hist.shape[0])
        state = model.initial_batch(hist)
        now = u(model.predict_batch(state, tgt)[..., :o_t]).sum(-1)  # [b]
        out = torch.zeros(b, len(cand), dtype=DTYPE)
        for j, x in enumerate(cand):
            free = hist[:, x] < 0
            if not bool(free.any()):
                continue
            p_x = model.predict_batch(state, [x])[:, 0, : n_opt[x]]  # [b, O_x]
            after = torch.zeros(b, dtype=DTYPE)
            items = torch.full((b,), x, dtype=torch.long)
            for k in range(n_opt[x]):
                opts = torch.where(free, torch.full((b,), k), torch.full((b,), MISSING))
                nxt = model.update_batch(state, items, opts)
                h = u(model.predict_batch(nxt, tgt)[..., :o_t]).sum(-1)
                after += p_x[:, k] * h
            out[:, j] = torch.where(free, now - after, torch.zeros((), dtype=DTYPE))
        parts.append(out)
    if not parts:
        return torch.zeros(0, len(cand), dtype=DTYPE)
    return torch.cat(parts)


def _expected_after(
    model: BeliefModel, state: Any, x: int, free: Tensor, targets: list[int]
) -> tuple[Tensor, Tensor]:
    """``([B], [B])``: ``E_k err(h, x=k)`` and ``E_k quad(h, x=k)`` under ``state``
    (members with ``free`` false keep ``err(h)``, ``quad(h)``: their update is a no-op),
    ``err = sum_t (1 - max_k p_tk)``, ``quad = sum_t (1 - sum_k p_tk^2)``."""
    n_opt = model.item_bank.n_options
    o_t = max((n_opt[t] for t in targets), default=1)
    b = int(free.shape[0])
    p_x = model.predict_batch(state, [x])[:, 0, : n_opt[x]]
    err = torch.zeros(b, dtype=DTYPE)
    quad = torch.zeros(b, dtype=DTYPE)
    items = torch.full((b,), x, dtype=torch.long)
    for k in range(n_opt[x]):
        opts = torch.where(free, torch.full((b,), k), torch.full((b,), MISSING))
        p_t = model.predict_batch(model.update_batch(state, items, opts), targets)[..., :o_t]
        err += p_x[:, k] * _expected_error(p_t).sum(-1)
        quad += p_x[:, k] * _quadratic(p_t).sum(-1)
    return err, quad


LOOKAHEAD_SECOND = 3
"""How many second questions the lookahead gain tries per member (see ``max_later`` of
:func:`member_lookahead_accuracy_gain`): a cost bound, not fitted to any dataset."""


def _expected_error_after_each(
    model: BeliefModel, state: Any, ys: Tensor, p_y: Tensor, free: Tensor, targets: list[int]
) -> Tensor:
    """``[B]``: ``E_k err(h_v, y_v = k)`` with a different question ``ys[v]`` per member,
    ``p_y [B, O]`` its predictive under ``state`` (members with ``free`` false keep
    ``err(h_v)``), ``err = sum_t (1 - max_k p_tk)``."""
    n_opt = torch.tensor(model.item_bank.n_options)
    o_t = max((int(n_opt[t]) for t in targets), default=1)
    b = int(ys.shape[0])
    n_y = n_opt[ys]
    out = torch.zeros(b, dtype=DTYPE)
    for k in range(int(n_y.max())):
        ok = free & (k < n_y)
        opts = torch.where(ok, torch.full((b,), k), torch.full((b,), MISSING))
        nxt = model.update_batch(state, ys, opts)
        e = _expected_error(model.predict_batch(nxt, targets)[..., :o_t]).sum(-1)
        out += torch.where(k < n_y, p_y[:, k], torch.zeros((), dtype=DTYPE)) * e
    return out


def _lookahead_gain_chunk(
    model: BeliefModel,
    hist: Tensor,
    q_b: float | Tensor,
    lookahead: bool,
    cand: list[int],
    pool_items: list[int],
    tgt: list[int],
    max_later: int | None,
) -> Tensor:
    """``[b, C]``: :func:`member_lookahead_accuracy_gain` for the members of one chunk,
    ``hist [b, I]``, with their chances ``q_b`` (one, or ``[b]``) and the distinct later
    questions ``pool_items``."""
    n_opt = model.item_bank.n_options
    o_t = max((n_opt[t] for t in tgt), default=1)
    u = _expected_error
    b = int(hist.shape[0])
    state = model.initial_batch(hist)
    err0 = u(model.predict_batch(state, tgt)[..., :o_t]).sum(-1)
    free = {x: hist[:, x] < 0 for x in {*cand, *pool_items}}
    after = {x: _expected_after(model, state, x, free[x], tgt) for x in free}
    e1 = {x: a[0] for x, a in after.items()}  # [b] each
    g = torch.zeros(b, len(cand), dtype=DTYPE)
    if pool_items and lookahead:
        quad_pool = torch.stack([after[y][1] for y in pool_items], 1)  # [b, P]
        width = len(pool_items) if max_later is None else min(len(pool_items), max_later + 1)
        rank = torch.argsort(quad_pool, dim=1, stable=True)[:, :width]  # [b, W]
        slot_item = torch.tensor(pool_items)[rank]  # [b, W]
        slot_free = torch.stack([free[y] for y in pool_items], 1).gather(1, rank)
    for j, x in enumerate(cand):
        if not bool(free[x].any()):
            continue
        g1 = err0 - e1[x]
        if not lookahead:
            g[:, j] = torch.where(free[x], g1, torch.zeros((), dtype=DTYPE))
            continue
        others = [y for y in pool_items if y != x]
        best_other = torch.stack([e1[y] for y in others]).min(0).values if others else err0
        if others:
            # slot r is used iff its question is not x and fewer than L slots before it
            # are; every member has the same number of used slots (the same questions
            # in its own order), so they are packed to the left: [b, n_used]
            use = slot_item != x
            if max_later is not None:
                use &= torch.cumsum(use.long(), 1) <= max_later
            n_used = int(use[0].sum())
            cols = torch.argsort((~use).to(torch.int8), dim=1, stable=True)[:, :n_used]
            items_x, free_x = slot_item.gather(1, cols), slot_free.gather(1, cols)
            pool_col = rank.gather(1, cols)  # [b, n_used] columns of pool_items
        p_x = model.predict_batch(state, [x])[:, 0, : n_opt[x]]
        items = torch.full((b,), x, dtype=torch.long)
        e2 = torch.zeros(b, dtype=DTYPE)
        for k in range(n_opt[x]):
            opts = torch.where(free[x], torch.full((b,), k), torch.full((b,), MISSING))
            st = model.update_batch(state, items, opts)
            if others:
                # one prediction of every later question serves all slots
                p_pool = model.predict_batch(st, pool_items)  # [b, P, O]
                rows = torch.arange(b)
                m = (
                    torch.stack(
                        [
                            _expected_error_after_each(
                                model,
                                st,
                                items_x[:, r],
                                p_pool[rows, pool_col[:, r]],
                                free_x[:, r],
                                tgt,
                            )
                            for r in range(n_used)
                        ]
                    )
                    .min(0)
                    .values
                )
            else:
                m = u(model.predict_batch(st, tgt)[..., :o_t]).sum(-1)
            e2 += p_x[:, k] * m
        g[:, j] = torch.where(
            free[x], (1 - q_b) * g1 + q_b * (best_other - e2), torch.zeros((), dtype=DTYPE)
        )
    return g


def member_lookahead_accuracy_gain(
    model: BeliefModel,
    history: Tensor,
    candidates: Sequence[int],
    targets: Sequence[int],
    q: float | Tensor,
    *,
    later: Sequence[int] | None = None,
    max_later: int | None = None,
    chunk: int = 8192,
) -> Tensor:
    """Accuracy gain of each candidate when the member may answer once more later.

    The accuracy gain (:func:`member_eig` with ``uncertainty="error"``) is myopic: an
    answer that cannot flip the most likely option of a target is worth 0 although it
    moves the distribution toward a flip by a later answer. With
    ``err(h) = sum_t (1 - max_k p(Y_t = k | h))`` (expected wrong targets):

        G1(x) = err(h) - E_k err(h, x=k)                          (one answer)
        M(x)  = min_{x' != x} E_{k'} err(h, x'=k')
                - E_k min_{x' in S_v(x)} E_{k'} err(h, x=k, x'=k')  (x, then the best x')
        gain  = (1 - q) G1(x) + q M(x)

    ``M`` is the value of ``x`` to a member who will also answer the best other question
    ``x'`` of ``later`` (default: ``candidates``; chosen after seeing the answer to
    ``x``), against answering that one alone;
    ``q`` is the chance of that later answer (:attr:`RoundContext.lookahead_q`: the
    share asked per round times the rounds left after this one, at most 1). ``q = 0``
    gives the accuracy gain exactly (and skips the second answer).

    ``S_v(x)``: the questions of ``later`` other than ``x`` (then ``M >= 0``: two answers
    never raise the expected 0-1 risk); with ``max_later = L`` only the ``L`` of them with
    the highest one-answer Brier gain for this member, i.e. the lowest
    ``E_k' sum_t (1 - sum_k p(Y_t = k | h_v, x'=k')^2)`` (ties: order of ``later``). The
    Brier gain ranks them because the accuracy gain is 0 for every question that cannot
    flip a target alone, which are the ones the lookahead is for; the Brier gain still
    tells how far each moves the targets. ``M`` can then only be smaller than with all of
    ``later`` (and may fall below 0 when the best single question is not among them).

    Cost: ``sum_x O_x`` batched updates for ``G1``, plus ``sum_x O_x (L + 1) O_max``
    for ``M`` with ``max_later = L`` (``(C O)^2`` with all of ``later``).

    Args:
        model, history, candidates, targets, chunk: as :func:`member_eig`.
        q: chance of one more answer, in ``[0, 1]``: one for all members, or ``[B]``
            per member (e.g. times its chance of answering when asked).
        later: the questions that may follow (the round's remaining candidates), so a
            candidate's gain does not depend on which others are scored with it.
        max_later: ``L``, the number of second questions tried per member (``None``:
            all of ``later``).

    Returns:
        ``[B, C]`` float64.
    """
    if isinstance(q, Tensor):
        q = q.to(DTYPE).reshape(-1)
        if q.shape[0] != history.shape[0] or bool(((q < 0) | (q > 1)).any()):
            raise GroupError(f"q must be one chance in [0, 1] or [{history.shape[0]}] of them")
        lookahead = bool((q > 0).any())
    elif not 0.0 <= q <= 1.0:
        raise GroupError(f"q must be in [0, 1], got {q}")
    else:
        lookahead = q > 0.0
    if max_later is not None and max_later < 1:
        raise GroupError(f"max_later must be >= 1 or None, got {max_later}")
    cand = [int(c) for c in candidates]
    nxt_pool = cand if later is None else [int(c) for c in later]
    tgt = [int(t) for t in targets]
    pool_items = list(dict.fromkeys(nxt_pool))
    parts = []
    for s in range(0, int(history.shape[0]), chunk):
        hist = history[s : s + chunk]
        q_b = q[s : s + chunk] if isinstance(q, Tensor) else q
        g = _lookahead_gain_chunk(model, hist, q_b, lookahead, cand, pool_items, tgt, max_later)
        parts.append(g)
    return torch.cat(parts) if parts else torch.zeros(0, len(cand), dtype=DTYPE)
