"""Replay the learning loop on CES to choose the default of ``refit_every`` (docs/models.md).

A study starts with ``--imported`` CES respondents (complete rows) and a model fitted on
them; ``--live`` other respondents then arrive one by one. Each is asked the demographics
for free, ``--budget`` questions chosen by ``eig`` with the model active at that moment,
and one calibration question drawn among the unasked (targets included); the live row
keeps only those answers. Every ``N`` live respondents the model is refitted on the
imported and live rows and promoted when it scores better on a held-out set of live rows
(the loop's rule, here the live rows whose index is 0 mod 5). The figure of merit is the
target log loss, after the adaptive questions, of the live respondents themselves
(what they experience), and the number of fits (what it costs); ``never`` keeps the first
model. Latent classes with a small grid (``--classes``, one restart) keep the replay to
minutes of CPU.

Usage: ``OMP_NUM_THREADS=1 python scripts/refit_every_replay.py --every 100 250 500 1000``
"""

from __future__ import annotations

import argparse
import time

import torch

from app.settings import REPO_ROOT
from elicitation.bench.individual import simulate
from elicitation.criteria import get_criterion
from elicitation.datasets import load_dataset
from elicitation.holdout import mean_log_likelihood
from models.base import ItemBank
from models.latent_class import fit_latent_classes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, nargs="+", default=[100, 250, 500, 1000])
    parser.add_argument("--imported", type=int, default=300)
    parser.add_argument("--live", type=int, default=3000)
    parser.add_argument("--budget", type=int, default=5)
    parser.add_argument("--classes", type=int, nargs="+", default=[8])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    ds = load_dataset(REPO_ROOT / "datasets" / "ces")
    y = torch.as_tensor(ds.responses.astype("int64"))
    bank = ItemBank(
        tuple(it.id for it in ds.codebook), tuple(len(it.letters) for it in ds.codebook)
    )
    run = ds.runs[0]
    cand = [ds.column(q) for q in run.cand_qids]
    tgt = [ds.column(q) for q in run.eval_qids]
    demo = [ds.column(q) for q in ds.demographics]
    gen = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(y.shape[0], generator=gen)
    imported = y[order[: args.imported]]
    live_full = y[order[args.imported : args.imported + args.live]]
    fit = {"n_classes": tuple(args.classes), "n_restarts": 1, "seed": args.seed, "ensemble": False}

    def fit_on(rows: torch.Tensor) -> object:
        return fit_latent_classes(rows, bank, **fit)  # type: ignore[arg-type]

    first = fit_on(imported)
    print(f"CES: {args.imported} imported, {args.live} live, budget {args.budget} + 1 calibration")
    print("refit_every  fits  promoted  live target log loss  cpu_s")
    for every in [*args.every, 0]:
        cpu = time.process_time()
        model, fits, promoted = first, 0, 0
        live_rows: list[torch.Tensor] = []
        losses: list[float] = []
        for start in range(0, args.live, 50):  # 50 respondents per step (same model)
            batch = live_full[start : start + 50]
            observed = torch.full_like(batch, -1)
            observed[:, demo] = batch[:, demo]
            preds, asked = simulate(
                model, get_criterion("eig"), observed, cand, batch[:, cand], tgt, args.budget
            )
            truth = batch[:, tgt]
            p = preds[-1].gather(-1, truth.clamp_min(0).unsqueeze(-1)).squeeze(-1)
            known = truth >= 0
            losses.append(float(-(p.clamp_min(1e-12).log() * known).sum() / known.sum()))
            row = observed.clone()
            idx = torch.arange(batch.shape[0]).unsqueeze(1).expand_as(asked)
            ok = asked >= 0
            row[idx[ok], asked[ok]] = batch[idx[ok], asked[ok]]
            for b in range(batch.shape[0]):
                free = [c for c in cand + tgt if row[b, c] < 0 and batch[b, c] >= 0]
                if free:
                    c = free[int(torch.randint(len(free), (1,), generator=gen))]
                    row[b, c] = batch[b, c]
            live_rows.append(row)
            n_live = start + batch.shape[0]
            if every and n_live % every == 0:
                rows = torch.cat(live_rows)
                held = torch.arange(rows.shape[0]) % 5 == 0
                candidate = fit_on(torch.cat([imported, rows[~held]]))
                fits += 1
                new = mean_log_likelihood(candidate, rows[held])  # type: ignore[arg-type]
                old = mean_log_likelihood(model, rows[held])  # type: ignore[arg-type]
                if new is not None and (old is None or new > old):
                    model, promoted = candidate, promoted + 1
        label = str(every) if every else "never"
        mean_loss = sum(losses) / len(losses)
        print(
            f"{label:>11}  {fits:>4}  {promoted:>8}  {mean_loss:>20.4f}  "
            f"{time.process_time() - cpu:>5.0f}"
        )


if __name__ == "__main__":
    main()
