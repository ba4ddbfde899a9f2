"""Fitting on adaptively collected answers (docs/methods.md, 1.10): a simulated study.

Respondents are drawn from a known latent-class model and asked adaptively by the
product's own selection (``eig`` through :func:`elicitation.bench.individual.simulate`,
which replays the live loop's criterion), then one calibration question chosen at random
among the unasked (without it, the items ``eig`` never picks cannot be learned at all:
the same fit is then 1.3 nats per respondent worse, from missing information, not bias);
the other questions are missing. A latent class fit on these rows (observed-data
likelihood) must score held-out complete respondents about as well as a fit on the
complete data and the true model, and clearly better than a fit that mishandles the
missing answers (filled in with the item's most frequent answer, as if the unasked had
answered it).
"""

from __future__ import annotations

import torch

from elicitation.bench.individual import simulate
from elicitation.criteria import get_criterion
from elicitation.holdout import mean_log_likelihood
from models.base import ItemBank
from models.latent_class import fit_latent_classes
from models.persona import PersonaMixture

N_CLASSES, N_ITEMS, N_OPTIONS = 3, 12, 3
ATTRIBUTE, CANDIDATES, TARGETS = 0, list(range(1, 10)), [10, 11]
BUDGET = 3


def _true_model(gen: torch.Generator) -> PersonaMixture:
    """Three well-separated classes: each item's answer is mostly one option per class."""
    mu = torch.full((N_CLASSES, N_ITEMS, N_OPTIONS), 0.1, dtype=torch.float64)
    favourite = torch.randint(0, N_OPTIONS, (N_CLASSES, N_ITEMS), generator=gen)
    for k in range(N_CLASSES):
        mu[k, torch.arange(N_ITEMS), favourite[k]] = 0.8
    bank = ItemBank(tuple(f"q{i}" for i in range(N_ITEMS)), (N_OPTIONS,) * N_ITEMS)
    return PersonaMixture(bank, mu, torch.log(torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)))


def _sample(model: PersonaMixture, n: int, gen: torch.Generator) -> torch.Tensor:
    classes = torch.multinomial(model.log_prior.exp(), n, replacement=True, generator=gen)
    probs = model.mu[classes]  # [n, N_ITEMS, N_OPTIONS]
    return torch.multinomial(probs.reshape(-1, N_OPTIONS), 1, generator=gen).reshape(n, N_ITEMS)


def test_adaptive_rows_fit_as_well_as_complete_rows() -> None:
    gen = torch.Generator().manual_seed(11)
    truth = _true_model(gen)
    complete = _sample(truth, 2000, gen)
    held_out = _sample(truth, 1000, gen)

    # ask adaptively: the attribute is known, then BUDGET questions chosen by eig on the
    # targets; the targets are answered (a calibration item), the rest is missing
    observed = torch.full_like(complete, -1)
    observed[:, ATTRIBUTE] = complete[:, ATTRIBUTE]
    _, asked = simulate(
        truth, get_criterion("eig"), observed, CANDIDATES, complete[:, CANDIDATES], TARGETS,
        BUDGET,
    )  # fmt: skip
    adaptive = observed.clone()
    rows = torch.arange(complete.shape[0]).unsqueeze(1).expand_as(asked)
    adaptive[rows, asked] = complete[rows, asked]
    adaptive[:, TARGETS] = complete[:, TARGETS]
    for b in range(complete.shape[0]):  # one calibration question among the unasked
        free = [c for c in CANDIDATES if adaptive[b, c] < 0]
        pick = free[int(torch.randint(len(free), (1,), generator=gen))]
        adaptive[b, pick] = complete[b, pick]
    # the pattern really is adaptive: several different question sets were asked
    assert len({tuple(sorted(r)) for r in asked.tolist()}) > 5
    assert int((adaptive >= 0).sum(1).max()) == 1 + BUDGET + 1 + len(TARGETS)

    fit = dict(n_classes=(N_CLASSES,), n_restarts=2, seed=0, ensemble=False)
    on_adaptive = fit_latent_classes(adaptive, truth.item_bank, **fit)  # type: ignore[arg-type]
    on_complete = fit_latent_classes(complete, truth.item_bank, **fit)  # type: ignore[arg-type]
    mode = torch.mode(torch.where(adaptive >= 0, adaptive, N_OPTIONS), 0).values  # per item
    imputed = torch.where(
        adaptive >= 0, adaptive, mode.clamp_max(N_OPTIONS - 1).expand_as(adaptive)
    )
    on_imputed = fit_latent_classes(imputed, truth.item_bank, **fit)  # type: ignore[arg-type]

    score = {
        name: mean_log_likelihood(model, held_out)
        for name, model in {
            "truth": truth,
            "adaptive": on_adaptive,
            "complete": on_complete,
            "imputed": on_imputed,
        }.items()
    }
    assert all(v is not None for v in score.values())
    s = {k: float(v) for k, v in score.items()}  # type: ignore[arg-type]
    # close to the complete-data fit and to the truth (nats per 12-item respondent) ...
    assert abs(s["adaptive"] - s["complete"]) < 0.15, s
    assert s["adaptive"] > s["truth"] - 0.2, s
    # ... and clearly better than a fit that fills in the unasked answers
    assert s["adaptive"] > s["imputed"] + 1.0, s
