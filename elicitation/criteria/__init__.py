"""Selection criteria: which question to ask next.

A criterion scores candidate items for a respondent whose belief state is ``state``
under a fitted :class:`models.base.BeliefModel`; a higher score is better. Criteria
never know the model family: they only call the interface of ``models.base``
(``predict``, ``lookahead``, the batched forms) and, where a criterion needs more, an
optional capability that it names in a clear error when the model lacks it
(``latent_posterior`` for ``posterior_entropy``; ``theta_posterior`` for ``irt``).

Notation: ``h`` the answers so far, ``x`` a candidate, ``I*`` the target items,
``H(p) = -sum_j p_j log p_j`` (nats, ``0 log 0 = 0``).

Modules (one abstract base, one module per criterion family, a registry from names to
classes, as BoTorch's ``acquisition`` package):

* :mod:`~elicitation.criteria.base` — :class:`SelectionCriterion`, entropy helpers,
  :func:`best_index`;
* :mod:`~elicitation.criteria.registry` — :func:`register_criterion`,
  :func:`get_criterion`, :func:`criterion_names`;
* :mod:`~elicitation.criteria.information` — ``eig``, ``eig_tempered``;
* :mod:`~elicitation.criteria.two_step` — ``eig2``;
* :mod:`~elicitation.criteria.orders` — ``random``, ``fixed``;
* :mod:`~elicitation.criteria.anchored` — ``eig_anchored`` (the app's default);
* :mod:`~elicitation.criteria.posterior` — ``posterior_entropy``, ``irt``.

Example::

    crit = get_criterion("eig_anchored")
    crit.prepare(model, pool, targets)        # the fixed order, once per model and pool
    scores = crit.score(model, state, candidates, targets)   # [C]
    next_item = candidates[best_index(scores)]

References:
    Adaptive Querying with AI Persona Priors (docs/methods.md [1]), Algorithms 1 and 2;
    see ``docs/methods.md`` §1.
"""

from elicitation.criteria.anchored import (
    DEFAULT_DELTA,
    DEFAULT_EVIDENCE_STRENGTH,
    AnchoredInformationGain,
)
from elicitation.criteria.base import (
    ItemList,
    SelectionCriterion,
    best_index,
    entropy,
    expected_target_entropy,
    mean_target_entropy,
)
from elicitation.criteria.information import (
    DEFAULT_TAU,
    ExpectedInformationGain,
    TemperedInformationGain,
)
from elicitation.criteria.orders import (
    FixedOrder,
    RandomOrder,
)
from elicitation.criteria.posterior import (
    IRTPosteriorVariance,
    PosteriorEntropy,
)
from elicitation.criteria.registry import (
    criterion_names,
    get_criterion,
    register_criterion,
)
from elicitation.criteria.two_step import (
    TwoStepInformationGain,
)

__all__ = [
    "AnchoredInformationGain",
    "DEFAULT_DELTA",
    "DEFAULT_EVIDENCE_STRENGTH",
    "DEFAULT_TAU",
    "ExpectedInformationGain",
    "FixedOrder",
    "IRTPosteriorVariance",
    "ItemList",
    "PosteriorEntropy",
    "RandomOrder",
    "SelectionCriterion",
    "TemperedInformationGain",
    "TwoStepInformationGain",
    "best_index",
    "criterion_names",
    "entropy",
    "expected_target_entropy",
    "get_criterion",
    "mean_target_entropy",
    "register_criterion",
]
