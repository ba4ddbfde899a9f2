"""Belief models: pure numerics (torch / numpy / scipy / pyro), no web imports.

Importing this package registers every model family with :func:`models.base.load_model`.
"""

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
    load_model,
    model_families,
    register_model,
    responses_hash,
)
from models.cape_cooccurrence import CapeCooccurrence
from models.cape_factor import CapeFactor
from models.cape_linear import CapeLinear
from models.cape_mixture import StackedMixture
from models.irt import GradedResponseModel, fit_grm
from models.latent_class import fit_independent, fit_latent_classes
from models.persona import (
    PersonaBatchState,
    PersonaMixture,
    PersonaState,
    one_hot_responses,
)
from models.persona_fit import compress, fit_prior_em, js_distance_matrix

__all__ = [
    "DTYPE",
    "GradedResponseModel",
    "fit_grm",
    "fit_independent",
    "fit_latent_classes",
    "MISSING",
    "BeliefModel",
    "CapeCooccurrence",
    "CapeFactor",
    "CapeLinear",
    "InvalidDistributionError",
    "InvalidOptionError",
    "ItemBank",
    "ModelError",
    "PersonaBatchState",
    "PersonaMixture",
    "PersonaState",
    "ShapeError",
    "StackedMixture",
    "UnknownItemError",
    "compress",
    "fit_prior_em",
    "js_distance_matrix",
    "load_model",
    "model_families",
    "one_hot_responses",
    "register_model",
    "responses_hash",
]
