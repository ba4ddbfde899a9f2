"""A fitted class's evidence (answers behind each ``μ[θ, i]``) and the evidence view that
``eig_anchored`` selects with, checked against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from models.base import DTYPE, ItemBank, ModelError, ShapeError, load_model
from models.latent_class import fit_em, fit_independent, fit_latent_classes
from models.persona import PersonaMixture
from tests.support.elicitation_cases import random_mixture


def _two_class_one_item() -> PersonaMixture:
    bank = ItemBank(("q",), (2,))
    mu = torch.tensor([[[0.9, 0.1]], [[0.2, 0.8]]], dtype=DTYPE)
    return PersonaMixture(bank, mu, evidence=torch.tensor([[5.0], [15.0]], dtype=DTYPE))


def test_evidence_view_is_the_docstring_example() -> None:
    view = _two_class_one_item().evidence_view(5.0)
    want = torch.tensor([[[0.725, 0.275]], [[0.2875, 0.7125]]], dtype=DTYPE)
    torch.testing.assert_close(view.mu, want, rtol=0, atol=1e-15)
    assert view.evidence is None
    torch.testing.assert_close(view.log_prior, _two_class_one_item().log_prior)


def test_evidence_view_leaves_given_and_unmeasured_models_alone() -> None:
    model = _two_class_one_item()
    assert model.evidence_view(0.0) is model
    assert model.evidence_view(5.0) is model.evidence_view(5.0)  # cached per strength
    given = PersonaMixture(model.item_bank, model.mu)
    assert given.evidence_view(5.0) is given
    # infinite evidence: a persona's own distributions stay as given
    inf = PersonaMixture(
        model.item_bank, model.mu, evidence=torch.tensor([[math.inf], [15.0]], dtype=DTYPE)
    )
    view = inf.evidence_view(5.0)
    torch.testing.assert_close(view.mu[0], model.mu[0], rtol=0, atol=0)
    torch.testing.assert_close(view.mu[1, 0, :2], torch.tensor([0.2875, 0.7125], dtype=DTYPE))
    # another prior moves the population distribution the view shrinks towards
    skewed = model.with_prior(torch.tensor([math.log(0.9), math.log(0.1)], dtype=DTYPE))
    pop = 0.9 * 0.9 + 0.1 * 0.2  # p̄[option 0] = 0.83
    assert float(skewed.evidence_view(5.0).mu[0, 0, 0]) == pytest.approx(
        0.5 * 0.9 + 0.5 * pop, abs=1e-15
    )


def test_evidence_is_checked_and_survives_serialisation() -> None:
    model = _two_class_one_item()
    again = load_model(model.to_bytes())
    assert isinstance(again, PersonaMixture) and again.evidence is not None
    assert torch.equal(again.evidence, model.evidence)  # type: ignore[arg-type]
    with pytest.raises(ShapeError, match="evidence"):
        PersonaMixture(model.item_bank, model.mu, evidence=torch.ones(2, 3, dtype=DTYPE))
    with pytest.raises(ModelError, match="evidence"):
        PersonaMixture(model.item_bank, model.mu, evidence=-torch.ones(2, 1, dtype=DTYPE))


def test_a_fit_records_each_class_answer_count() -> None:
    """Σ_θ evidence[θ, i] is item i's number of answers (Σ_θ γ[u, θ] = 1); one class holds
    them all; an ensemble of R fits holds R copies."""
    truth = random_mixture((2, 3, 2, 4), k=3, seed=7)
    gen = torch.Generator().manual_seed(3)
    cls = torch.multinomial(truth.log_prior.exp(), 200, replacement=True, generator=gen)
    y = torch.stack(
        [
            torch.multinomial(truth.mu[cls, i, :o], 1, generator=gen).squeeze(1)
            for i, o in enumerate(truth.item_bank.n_options)
        ],
        dim=1,
    )
    y[torch.rand(y.shape, generator=gen) < 0.3] = -1
    answered = (y >= 0).sum(0).to(DTYPE)
    bank = truth.item_bank
    fit = fit_em(y, bank, 3, max_iter=50, seed=1)
    assert fit.evidence is not None and fit.evidence.shape == (3, 4)
    torch.testing.assert_close(fit.evidence.sum(0), answered, rtol=0, atol=1e-9)
    assert bool((fit.evidence >= 0).all())
    one = fit_independent(y, bank)
    torch.testing.assert_close(one.evidence, answered.unsqueeze(0), rtol=0, atol=1e-9)
    model = fit_latent_classes(y, bank, n_classes=(2, 3), n_restarts=2, seed=0)
    assert isinstance(model, PersonaMixture) and model.evidence is not None
    copies = model.evidence.sum(0) / answered
    assert float(copies[0]) >= 1 and float(copies[0]) == round(float(copies[0]))
    torch.testing.assert_close(copies, torch.full_like(copies, float(copies[0])))
