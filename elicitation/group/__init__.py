"""Group elicitation rounds: whom to ask what (docs/methods.md §3).

A *group* of ``N`` members (each with attributes and a few answers) is elicited in
rounds. Each round picks **one question** for the whole group and a **subset of
members** to ask it, under budgets; answers arrive (some members do not answer), and
the predictions of every member's answers to the group's **target** items are updated.

Pieces (each a small family with a registry, like :mod:`elicitation.criteria`):

* question selectors (:data:`QUESTION_SELECTORS`):
  ``random``; ``eig`` — expected information gain about the group's targets summed over
  all members (optionally a random subsample of them, docs/methods.md [3]'s 10%):
  ``EIG(x) = sum_v [ H_v - E_{Y_vx} H_v(. | Y_vx) ]`` with ``H_v = sum_t H(p(Y_vt | h_v))``;
  ``eig_budget`` — the same gain counted only for the members that would actually be
  asked: the ``b`` largest ``r_v * EIG_v(x)`` (``b`` = the round's respondent budget,
  ``r_v`` = the chance member ``v`` answers);
* respondent selectors (:data:`RESPONDENT_SELECTORS`): ``random``; ``relational`` —
  k-means (k = budget) over GNN member embeddings, the member nearest each centroid
  (two-level k-means for large groups, :func:`two_level_kmeans_pick`);
  ``eig`` — greedy by expected gain ``r_v * EIG_v(x)`` about the group targets (the
  belief models here treat members as independent given the fitted parameters, so the
  gains add up and the greedy choice is the top ``b``);
* imputation of members without an answer to the round's question
  (:data:`IMPUTATIONS`): ``none``; ``self`` — the predictor's own most likely answer
  joins the member's history; ``gnn`` — the GNN's most likely answer joins the history
  ([3]); ``gnn_only`` — target predictions come from the GNN alone; ``pool`` —
  the calibrated log-linear pool ``p ∝ p_belief^(1-w) * p_gnn^w`` of the belief model
  and the GNN, ``w`` fitted on validation members (:func:`fit_pool_weight`); ``stack`` —
  the stacked log-linear pool ``p ∝ p_belief^a * p_gnn^c * p_imputed^d`` of the belief
  model, the GNN and the belief model with the GNN's guesses imputed, weights ``>= 0``
  (free sum: they set the temperature too) fitted per round by maximum likelihood on
  validation members (:func:`fit_stack_weights`); it holds ``none`` ``(1, 0, 0)``,
  ``pool`` ``(1 - w, w, 0)``, ``gnn_only`` ``(0, 1, 0)`` and the target predictions of GNN
  imputation ``(0, 0, 1)`` as special cases.

A round in which nobody answers changes nothing: no new information arrived, so no
imputation is made and every prediction stays as it was.

Any belief model of :mod:`models.base` with batched forms (``initial_batch``,
``predict_batch``, ``lookahead_batch``) can be the predictor; states are recomputed from
the observed (and imputed) answers, so a state always equals the replay of its answers.

Modules: :mod:`~elicitation.group.budget` (:class:`GroupBudget`),
:mod:`~elicitation.group.gains` (member gains), :mod:`~elicitation.group.selectors`
(:class:`RoundContext`, question and respondent selectors),
:mod:`~elicitation.group.clustering` (k-means picks), :mod:`~elicitation.group.pools`
(pool and stack), :mod:`~elicitation.group.prior` (group-level prior),
:mod:`~elicitation.group.elicitation` (:class:`GroupMethod`, :class:`GroupElicitation`),
:mod:`~elicitation.group.live` (:func:`plan_round`: the live planner, the one function the
app's plan job and the benchmark's ``live`` method call).

Example::

    ge = GroupElicitation(model, observed, candidates, targets,
                          GroupMethod("elook_budget", "elook", "pool", online_pool=True),
                          GroupBudget(respondents=0.1, rounds=4), gnn=view)
    question, members, scores = ge.plan()
    ge.apply(question, members, answers, scores=scores)
    p = ge.predict_targets()   # [N, T, O]
"""

from elicitation.errors import GroupError
from elicitation.group.budget import (
    GroupBudget,
)
from elicitation.group.clustering import (
    COARSE_SAMPLE_PER_CLUSTER,
    allocate_proportional,
    kmeans,
    nearest_distinct,
    two_level_kmeans_pick,
)
from elicitation.group.elicitation import (
    IMPUTATIONS,
    GroupElicitation,
    GroupMethod,
    RoundRecord,
)
from elicitation.group.gains import (
    LOOKAHEAD,
    LOOKAHEAD_SECOND,
    LOOKAHEAD_TOP,
    UNCERTAINTIES,
    member_eig,
    member_lookahead_accuracy_gain,
)
from elicitation.group.live import (
    SELECTION_LABELS,
    SELECTIONS,
    ClosedRound,
    GroupState,
    PlannerModels,
    RoundPlan,
    calibration_sample,
    live_method,
    plan_round,
    replay,
    validation_pool,
)
from elicitation.group.pools import (
    POOL_GRID,
    STACK_COMPONENTS,
    choose_pool_weight,
    fit_pool_weight,
    fit_stack_weights,
    log_linear_pool,
    pool_gain_rows,
    pool_weight_from_gains,
    shrunk_stack_weights,
    stack_gain_rows,
    stacked_pool,
)
from elicitation.group.prior import (
    adapt_mixture_prior,
)
from elicitation.group.selectors import (
    KMEANS_EXACT_MAX,
    QUESTION_SELECTORS,
    RESPONDENT_SELECTORS,
    SELECTOR_GAINS,
    BudgetEIGQuestion,
    EIGRespondents,
    GNNView,
    GroupEIGQuestion,
    QuestionSelector,
    RandomQuestion,
    RandomRespondents,
    RelationalRespondents,
    RespondentSelector,
    RoundContext,
)

__all__ = [
    "BudgetEIGQuestion",
    "COARSE_SAMPLE_PER_CLUSTER",
    "ClosedRound",
    "EIGRespondents",
    "GNNView",
    "GroupBudget",
    "GroupEIGQuestion",
    "GroupElicitation",
    "GroupError",
    "GroupMethod",
    "GroupState",
    "IMPUTATIONS",
    "KMEANS_EXACT_MAX",
    "LOOKAHEAD",
    "LOOKAHEAD_SECOND",
    "LOOKAHEAD_TOP",
    "POOL_GRID",
    "PlannerModels",
    "QUESTION_SELECTORS",
    "QuestionSelector",
    "RESPONDENT_SELECTORS",
    "RandomQuestion",
    "RandomRespondents",
    "RelationalRespondents",
    "RespondentSelector",
    "RoundContext",
    "RoundPlan",
    "RoundRecord",
    "SELECTIONS",
    "SELECTION_LABELS",
    "SELECTOR_GAINS",
    "STACK_COMPONENTS",
    "UNCERTAINTIES",
    "adapt_mixture_prior",
    "allocate_proportional",
    "calibration_sample",
    "choose_pool_weight",
    "fit_pool_weight",
    "fit_stack_weights",
    "kmeans",
    "live_method",
    "log_linear_pool",
    "member_eig",
    "member_lookahead_accuracy_gain",
    "nearest_distinct",
    "plan_round",
    "pool_gain_rows",
    "pool_weight_from_gains",
    "replay",
    "shrunk_stack_weights",
    "stack_gain_rows",
    "stacked_pool",
    "two_level_kmeans_pick",
    "validation_pool",
]
