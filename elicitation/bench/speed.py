"""Latency of one live elicitation step with a large persona dictionary.

A live step is what the web app does after an answer: ``model.update`` with the answer,
then :func:`elicitation.session.decide` with the criterion ``criterion`` (default ``eig``)
over the remaining candidates (scores of every candidate, the stopping rule, the expected target entropy).

Set-up: the persona dictionary of a folder like ``datasets/wvs_personas`` (a
``persona_answers_deterministic.csv`` of ``K`` personas x ``I`` items with answers on each
item's scale, and ``question_metadata.json`` giving each item's scale min and max),
turned into distributions with ``ε`` (docs/methods.md §1); ``n_targets`` targets chosen
by a seeded permutation of the items; all other items are candidates. Simulated
respondents: a persona drawn from the prior, answers drawn from its distributions.

Two figures: the p50/p99 latency (ms) of single-respondent steps over ``steps`` steps
(after a warm-up), with ``torch.set_num_threads(threads)``; and respondent-steps per
second for a batch of ``batch`` respondents (``update_batch`` + ``eig.score_batch``
over all candidates + masked argmax). Wall-clock figures (``p50_ms``...) are what a
respondent waits; the ``*_cpu_*`` figures count only the time the measuring thread ran
(``time.thread_time``), which is what to compare on a machine shared with other jobs
(``load_average_1min`` is recorded).
"""

from __future__ import annotations

import csv
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from elicitation.budget import Budget
from elicitation.criteria import SelectionCriterion, get_criterion
from elicitation.errors import BenchmarkError, ElicitationError
from elicitation.session import decide
from models.base import ItemBank
from models.persona import PersonaMixture
from models.persona_fit import compress_for_live

ANSWERS_FILE = "persona_answers_deterministic.csv"
METADATA_FILE = "question_metadata.json"


def load_persona_dictionary(folder: str | Path, epsilon: float) -> PersonaMixture:
    """A :class:`PersonaMixture` from deterministic persona answers (uniform prior).

    Raises:
        BenchmarkError: a missing file, an item without a scale, or an answer off its scale
            (naming the file, row and column).
    """
    folder = Path(folder)
    ans_path, meta_path = folder / ANSWERS_FILE, folder / METADATA_FILE
    for p in (ans_path, meta_path):
        if not p.is_file():
            raise BenchmarkError(f"persona dictionary: {p} does not exist")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise BenchmarkError(f"{meta_path.name}: invalid JSON: {exc}") from None
    with ans_path.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header or len(header) < 2:
            raise BenchmarkError(f"{ans_path.name}: no header with item columns")
        items = header[1:]
        lo: list[int] = []
        n_opt: list[int] = []
        for q in items:
            m = meta.get(q) if isinstance(meta, dict) else None
            try:
                a, b = int(m["answer_scale_min"]), int(m["answer_scale_max"])  # type: ignore[index]
            except (TypeError, KeyError, ValueError):
                raise BenchmarkError(
                    f"{meta_path.name}: item {q!r} has no integer answer scale"
                ) from None
            if b <= a:
                raise BenchmarkError(f"{meta_path.name}: item {q!r} has scale {a}..{b}")
            lo.append(a)
            n_opt.append(b - a + 1)
        rows: list[list[int]] = []
        labels: list[str] = []
        for r, row in enumerate(reader, start=1):
            if len(row) != len(header):
                raise BenchmarkError(
                    f"{ans_path.name}, row {r}: {len(row)} cells, expected {len(header)}"
                )
            vals = []
            for j, cell in enumerate(row[1:]):
                try:
                    v = int(cell) - lo[j]
                except ValueError:
                    raise BenchmarkError(
                        f"{ans_path.name}, row {r}, column {items[j]!r}: {cell!r} is not an integer"
                    ) from None
                if not 0 <= v < n_opt[j]:
                    raise BenchmarkError(
                        f"{ans_path.name}, row {r}, column {items[j]!r}: {cell} is off the scale"
                    )
                vals.append(v)
            rows.append(vals)
            labels.append(row[0])
    if not rows:
        raise BenchmarkError(f"{ans_path.name}: no personas")
    bank = ItemBank(tuple(items), tuple(n_opt))
    return PersonaMixture.from_deterministic(torch.tensor(rows), bank, epsilon, labels=labels)


def grow_dictionary(
    model: PersonaMixture, n: int, epsilon: float, *, seed: int = 0, redraw: float = 0.3
) -> PersonaMixture:
    """An ``n``-persona dictionary grown from ``model``'s (deterministic) personas, for
    measuring the live step at a size no bundled dataset has.

    Persona ``j`` copies the modal answers of a persona drawn uniformly (seeded), then
    redraws each answer with probability ``redraw`` uniformly over the item's options;
    answers become distributions with ``ε`` (:meth:`PersonaMixture.from_deterministic`);
    uniform prior. Example: the 2,058 WVS personas grown to 20,000.
    """
    if n < 1:
        raise BenchmarkError(f"speed: --personas must be at least 1, got {n}")
    gen = torch.Generator().manual_seed(seed)
    bank = model.item_bank
    base = model.mu.argmax(-1)  # [K, I] modal answers
    rows = base[torch.randint(model.n_personas, (n,), generator=gen)]
    n_opt = torch.tensor(bank.n_options, dtype=torch.float64)
    fresh = (torch.rand(n, bank.n_items, generator=gen, dtype=torch.float64) * n_opt).long()
    flip = torch.rand(n, bank.n_items, generator=gen) < redraw
    answers = torch.where(flip, fresh, rows)
    return PersonaMixture.from_deterministic(
        answers, bank, epsilon, labels=[f"grown-{j + 1}" for j in range(n)]
    )


def _load_average() -> float | None:
    """The 1-minute load average (to judge wall-clock figures on a shared machine)."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def _time_steps(
    model: PersonaMixture,
    eig: SelectionCriterion,
    cand: list[int],
    targets: list[int],
    budget: Budget,
    respondent_answers: Callable[[int], Tensor],
    n_steps: int,
) -> tuple[list[float], list[float], dict[str, int]]:
    """Time ``n_steps`` live steps (``model.update`` then ``decide``) of simulated
    respondents, one after another: ``(wall seconds, CPU seconds, stop reasons)``."""
    times: list[float] = []
    cpu_times: list[float] = []
    stop_reasons: dict[str, int] = {}
    while len(times) < n_steps:
        y = respondent_answers(1)[0]
        state = model.initial_state()
        asked: list[int] = []
        d = decide(
            model,
            state,
            asked=asked,
            candidates=cand,
            targets=targets,
            criterion=eig,
            budget=budget,
        )
        while d.item is not None and len(times) < n_steps:
            item = d.item
            c0 = time.thread_time()
            t0 = time.perf_counter()
            state = model.update(state, item, int(y[item]))
            asked.append(item)
            d = decide(
                model,
                state,
                asked=asked,
                candidates=cand,
                targets=targets,
                criterion=eig,
                budget=budget,
            )
            times.append(time.perf_counter() - t0)
            cpu_times.append(time.thread_time() - c0)
        if d.stop_reason is not None:
            stop_reasons[str(d.stop_reason)] = stop_reasons.get(str(d.stop_reason), 0) + 1
    return times, cpu_times, stop_reasons


def _time_batch(
    model: PersonaMixture,
    eig: SelectionCriterion,
    cand: list[int],
    targets: list[int],
    y: Tensor,
    batch_steps: int,
) -> tuple[int, float, float]:
    """Time ``B`` respondents (answers ``y [B, I]``) stepping together: each step scores
    all candidates and asks the best unasked one. ``(steps, wall seconds, CPU seconds)``."""
    b_size = int(y.shape[0])
    bank = model.item_bank
    states = model.initial_batch(torch.full((b_size, bank.n_items), -1, dtype=torch.long))
    cand_t = torch.tensor(cand)
    avail = torch.ones(b_size, len(cand), dtype=torch.bool)
    rows = torch.arange(b_size)
    n_b = min(batch_steps, len(cand))
    c0 = time.thread_time()
    t0 = time.perf_counter()
    for _ in range(n_b):
        scores = eig.score_batch(model, states, cand, targets).masked_fill(~avail, -torch.inf)
        pick = scores.argmax(1)
        items = cand_t[pick]
        states = model.update_batch(states, items, y[rows, items])
        avail[rows, pick] = False
    elapsed = time.perf_counter() - t0
    cpu_elapsed = time.thread_time() - c0
    return n_b, elapsed, cpu_elapsed


def run_speed(
    personas: str | Path,
    *,
    n_personas: int | None = None,
    compress: str = "auto",
    steps: int = 1000,
    batch: int = 1000,
    batch_steps: int = 10,
    n_targets: int = 5,
    epsilon: float = 0.05,
    questions_per_respondent: int = 20,
    warmup: int = 50,
    threads: int = 1,
    seed: int = 0,
    criterion: str = "eig",
) -> dict[str, Any]:
    """Measure a live step; returns the ``speed.json`` object (see the module docstring).

    ``n_personas``: grow the folder's dictionary to that many personas
    (:func:`grow_dictionary`). ``compress``: ``"auto"`` compresses like the app's live
    persona prior (:func:`models.persona_fit.compress_for_live`: above 2,000 personas, to
    500 prototypes; the compression is offline, timed apart in
    ``compression_cpu_seconds``), ``"none"`` steps on the whole dictionary.
    """
    if compress not in ("auto", "none"):
        raise BenchmarkError(f"speed: --compress must be auto or none, got {compress!r}")
    for name, v, least in (
        ("steps", steps, 1),
        ("batch", batch, 1),
        ("batch_steps", batch_steps, 1),
        ("n_targets", n_targets, 1),
        ("questions_per_respondent", questions_per_respondent, 1),
        ("threads", threads, 1),
        ("warmup", warmup, 0),
    ):
        if v < least:
            raise BenchmarkError(f"speed: {name} must be >= {least}, got {v}")
    torch.set_num_threads(threads)
    model = load_persona_dictionary(personas, epsilon)
    if n_personas is not None:
        model = grow_dictionary(model, n_personas, epsilon, seed=seed)
    dictionary_size = model.n_personas
    full = model  # simulated respondents come from the whole dictionary
    compression_s = None
    if compress == "auto":
        c0 = time.thread_time()
        model = compress_for_live(model, seed=seed)
        if model.n_personas != dictionary_size:
            compression_s = time.thread_time() - c0
    bank = model.item_bank
    if n_targets >= bank.n_items:
        raise BenchmarkError(
            f"speed: n_targets ({n_targets}) must be below the {bank.n_items} items"
        )
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(bank.n_items, generator=gen)
    targets = sorted(perm[:n_targets].tolist())
    cand = [i for i in range(bank.n_items) if i not in set(targets)]
    prior = full.log_prior.exp()
    mu = full.mu  # [K, I, O]

    def respondent_answers(n: int) -> torch.Tensor:
        theta = torch.multinomial(prior, n, replacement=True, generator=gen)
        p = mu[theta].reshape(-1, mu.shape[-1])
        return torch.multinomial(p, 1, generator=gen).reshape(n, bank.n_items)

    try:
        eig = get_criterion(criterion)
    except ElicitationError as exc:
        raise BenchmarkError(f"speed: {exc}") from None
    # A criterion anchored to the fixed order gets it once, before any step (a live study
    # computes it with the model fit and stores it; it is never part of a step).
    order_s = None
    if eig.uses_fixed_order:
        t_order = time.thread_time()
        eig.prepare(model, cand, targets)
        order_s = time.thread_time() - t_order
    budget = Budget(max_questions=questions_per_respondent)
    times, cpu_times, stop_reasons = _time_steps(
        model, eig, cand, targets, budget, respondent_answers, steps + warmup
    )
    ms = np.asarray(times[warmup:]) * 1e3
    cpu_ms = np.asarray(cpu_times[warmup:]) * 1e3

    # batch: B respondents, each step scores all candidates and asks the best unasked one
    y = respondent_answers(batch)
    n_b, elapsed, cpu_elapsed = _time_batch(model, eig, cand, targets, y, batch_steps)
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": float(ms.mean()),
        "max_ms": float(ms.max()),
        "p50_cpu_ms": float(np.percentile(cpu_ms, 50)),
        "p99_cpu_ms": float(np.percentile(cpu_ms, 99)),
        "steps": int(ms.size),
        "warmup_steps": warmup,
        "batch_size": batch,
        "batch_steps": n_b,
        "batch_steps_per_second": batch * n_b / elapsed,
        "batch_step_ms": elapsed / n_b * 1e3,
        "batch_steps_per_cpu_second": batch * n_b / cpu_elapsed if cpu_elapsed > 0 else None,
        "load_average_1min": _load_average(),
        "threads": threads,
        "personas": dictionary_size,
        "live_personas": model.n_personas,
        "compression": compress,
        "compression_cpu_seconds": compression_s,
        "items": bank.n_items,
        "options": bank.max_options,
        "targets": [bank.keys[t] for t in targets],
        "candidates": len(cand),
        "epsilon": epsilon,
        "questions_per_respondent": questions_per_respondent,
        "step": (
            f"model.update + elicitation.session.decide(criterion={criterion}) over the "
            "remaining candidates"
        ),
        "criterion": criterion,
        "fixed_order_cpu_seconds": order_s,
        "torch": torch.__version__,
    }
