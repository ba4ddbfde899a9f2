"""Small constructed persona mixtures shared by the elicitation tests."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import torch

from models.base import DTYPE, ItemBank
from models.persona import PersonaMixture


def random_mixture(
    n_options: tuple[int, ...], k: int, seed: int, concentration: float = 0.7
) -> PersonaMixture:
    """A mixture with Dirichlet-random answer tables and a random prior."""
    gen = torch.Generator().manual_seed(seed)
    bank = ItemBank(tuple(f"q{i}" for i in range(len(n_options))), n_options)
    mu = torch.zeros(k, len(n_options), max(n_options), dtype=DTYPE)
    for i, o in enumerate(n_options):
        g = torch._standard_gamma(torch.full((k, o), concentration, dtype=DTYPE), generator=gen)
        mu[:, i, :o] = g / g.sum(-1, keepdim=True)
    log_prior = torch.randn(k, generator=gen, dtype=DTYPE)
    return PersonaMixture(bank, mu, log_prior)


def informative_mixture(eps: float = 0.01) -> PersonaMixture:
    """Items: 0 = perfectly informative about the target, 1..3 = pure noise, 4 = target.

    Four personas in two groups (0,1 vs 2,3). Item 0 and the target item 4 both answer
    the group (1 - eps on it). Items 1, 2, 3 have the same distribution for every
    persona, so they carry no information about anything; item 3 has three options.
    """
    bank = ItemBank(("informative", "noise_a", "noise_b", "noise_c", "target"), (2, 2, 2, 3, 2))
    mu = torch.zeros(4, 5, 3, dtype=DTYPE)
    group = torch.tensor([0, 0, 1, 1])
    for item in (0, 4):
        mu[:, item, :2] = eps
        mu[torch.arange(4), item, group] = 1 - eps
    mu[:, 1, :2] = torch.tensor([0.3, 0.7], dtype=DTYPE)
    mu[:, 2, :2] = torch.tensor([0.5, 0.5], dtype=DTYPE)
    mu[:, 3, :3] = torch.tensor([0.2, 0.5, 0.3], dtype=DTYPE)
    return PersonaMixture(bank, mu)


TINY_DEMOGRAPHICS = {"d1": 3, "d2": 2}
TINY_QUESTIONS = {"q1": 2, "q2": 2, "q3": 3, "q4": 2, "q5": 2, "q6": 3, "q7": 2, "q8": 2}
TINY_RUNS = [
    (0, ["q1", "q2", "q3", "q4", "q5"], ["q6", "q7"]),
    (1, ["q2", "q4", "q6", "q7", "q8"], ["q1", "q3"]),
]


def write_tiny_dataset(
    dest: Path, *, n_users: int = 240, missing: float = 0.1, seed: int = 0
) -> Path:
    """A small dataset in the canonical format, drawn from a 3-class latent class model.

    Two demographics and eight questions (2 or 3 options); ``missing`` of the question
    cells are empty; users split 50% train / 17% validation / 33% test; two benchmark
    runs of 5 candidates and 2 targets. Returns ``dest``.
    """
    gen = torch.Generator().manual_seed(seed)
    items = {**TINY_DEMOGRAPHICS, **TINY_QUESTIONS}
    n_classes = 3
    z = torch.randint(n_classes, (n_users,), generator=gen)
    dest.mkdir(parents=True, exist_ok=True)
    columns: dict[str, list[str]] = {}
    for key, o in items.items():
        g = torch._standard_gamma(torch.full((n_classes, o), 0.4, dtype=DTYPE), generator=gen)
        table = g / g.sum(-1, keepdim=True)
        ans = torch.multinomial(table[z], 1, generator=gen).squeeze(1)
        cells = ["ABC"[int(a)] for a in ans]
        if key in TINY_QUESTIONS:
            drop = torch.rand(n_users, generator=gen) < missing
            cells = ["" if d else c for c, d in zip(cells, drop.tolist(), strict=True)]
        columns[key] = cells
    ids = [f"u{n}" for n in range(n_users)]
    with (dest / "responses.csv").open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["rid", *items])
        for n, rid in enumerate(ids):
            w.writerow([rid, *(columns[k][n] for k in items)])
    with (dest / "codebook.jsonl").open("w", encoding="utf-8") as fh:
        for key, o in items.items():
            opts = {"ABC"[j]: f"option {j}" for j in range(o)}
            fh.write(
                json.dumps({"id": key, "question": f"Question {key}?", "options": opts}) + "\n"
            )
    manifest = {
        "name": "tiny",
        "id_column": "rid",
        "demographics": list(TINY_DEMOGRAPHICS),
        "questions": list(TINY_QUESTIONS),
        "split": "user_split.json",
        "runs": "runs.csv",
    }
    (dest / "dataset.json").write_text(json.dumps(manifest), encoding="utf-8")
    n_tr, n_val = n_users // 2, n_users // 6
    split = {
        "train_users": ids[:n_tr],
        "val_users": ids[n_tr : n_tr + n_val],
        "test_users": ids[n_tr + n_val :],
    }
    (dest / "user_split.json").write_text(json.dumps(split), encoding="utf-8")
    with (dest / "runs.csv").open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["seed", "cand_qids", "eval_qids"])
        for s, cand, ev in TINY_RUNS:
            w.writerow([s, repr(cand), repr(ev)])
    return dest
