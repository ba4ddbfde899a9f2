"""``priorly bench group``: the published group-elicitation protocol (docs/methods.md §3).

Protocol (docs/methods.md [3], on a canonical dataset with a user split and runs):

* the belief model (a latent class model, :func:`models.latent_class.fit_latent_classes`,
  the number of classes chosen on validation users) and the GNN are fitted on the
  training users (validation users for model selection / early stopping);
* the group is the test users; each member starts with its demographics observed;
* for each of the runs in ``runs.csv`` (20 candidate questions, 5 target questions):
  ``rounds`` rounds, each asking one candidate question to the chosen respondents
  (``respondent_budget`` of the group per round); a member whose answer is missing in
  the data, or who does not respond (probability ``nonresponse``), gives no answer;
* after every round (and before the first) every test member's 5 targets are scored:
  accuracy, Brier summed over options, perplexity ``exp(mean log loss)``; the result is
  the mean over the runs.

Methods (:data:`GROUP_METHODS`): [3]'s baselines and method with our predictor,
the product's ``default`` (the pool of the belief model and the GNN at the weight with
the highest lower confidence bound on its gain, re-chosen online), the stacked pools
(``*_stack``, ``*_stack_lcb``), and variants of the question, respondent and imputation
rules for comparison.

Example::

    result = run_group("datasets/ces", respondent_budget=0.1, rounds=4, methods=["default"])
    result["methods"]["default"]["accuracy"]  # [rounds + 1], mean over the runs
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from elicitation.bench.defaults import DEFAULT_GROUP_METHODS as _DEFAULT_GROUP_METHODS
from elicitation.bench.metrics import MetricSums, score_predictions
from elicitation.datasets import Dataset, load_dataset
from elicitation.errors import BenchmarkError
from elicitation.group import (
    GNNView,
    GroupBudget,
    GroupElicitation,
    GroupMethod,
    GroupState,
    PlannerModels,
    calibration_sample,
    choose_pool_weight,
    fit_pool_weight,
    fit_stack_weights,
    plan_round,
    replay,
    stack_gain_rows,
    stacked_pool,
)
from elicitation.group.live import SELECTIONS, ClosedRound
from gnn.graph import GraphSchema
from gnn.train import GNNConfig, TrainedGNN, train_gnn
from models.base import DTYPE, BeliefModel, ItemBank, load_model
from models.latent_class import fit_latent_classes


def _imputation_family(prefix: str, question: str, respondents: str) -> dict[str, GroupMethod]:
    """One question and respondent rule with each way of predicting the targets (§4's
    imputation comparison), named ``<prefix>_<mode>``:

    * ``pool``: the log-linear pool of the belief model and the GNN with the weight of
      highest lower confidence bound on its gain, on validation members and, after each
      round, the group's own answers (0 = the belief model alone unless the GNN
      demonstrably helps);
    * ``pool_val``: the pool with the weight that is best on validation members, used
      whatever the evidence (no standard-error rule, not re-chosen online): what trusting
      validation alone gives;
    * ``none`` (never the GNN), ``gnn`` (the GNN's most likely answer imputed for
      members not asked), ``gnn_only`` (targets from the GNN alone);
    * ``stack``: ``p ∝ p_belief^a * p_gnn^c * p_imputed^d`` with weights fitted
      per round by maximum likelihood on validation members run through the same rounds
      (:func:`fit_stack_on_validation`; it holds none, pool, gnn_only and the targets of
      GNN imputation as special cases), used as fitted; ``stack_lcb``: the same, shrunk
      toward the belief model by the factor with the highest lower confidence bound on
      its gain over those validation members and the group's own answers (online).
      On held-out validation members (:func:`stack_holdout_check`) the stack's two extra
      weights do not hold up out of sample, so ``default`` uses the one-weight pool.
    """
    q, r = question, respondents
    return {
        f"{prefix}_pool": GroupMethod(q, r, "pool", online_pool=True),
        f"{prefix}_pool_val": GroupMethod(q, r, "pool"),
        f"{prefix}_none": GroupMethod(q, r, "none"),
        f"{prefix}_gnn": GroupMethod(q, r, "gnn"),
        f"{prefix}_gnn_only": GroupMethod(q, r, "gnn_only"),
        f"{prefix}_stack": GroupMethod(q, r, "stack"),
        f"{prefix}_stack_lcb": GroupMethod(q, r, "stack", online_pool=True),
    }


GROUP_METHODS: dict[str, GroupMethod] = {
    # the paper's baselines, with our predictor
    "random_random": GroupMethod("random", "random", "none"),
    "greedy_random": GroupMethod("eig", "random", "none"),
    "greedy_random_selfimpute": GroupMethod("eig", "random", "self"),
    # the paper's method: greedy question, relational respondents, GNN imputation
    "greedy_relational_gnn": GroupMethod("eig", "relational", "gnn"),
    # the product's choice: the question and respondents by the expected
    # rise in target accuracy with one more answer ahead at the chance the budget gives
    # (``elook``: each member's 3 best second questions by Brier gain, about 4 C O^2
    # batched updates instead of the (C O)^2 of ``eacc2``), with the pool; the same as
    # ``elook_elook_pool``
    "default": GroupMethod("elook_budget", "elook", "pool", online_pool=True),
    # the live planner (:func:`elicitation.group.plan_round`, what the app's plan job
    # calls): each round replays the closed rounds and plans, as the app does; the same
    # choices as ``default`` (a test ties them)
    "live": SELECTIONS["elook"][0],
    **_imputation_family("elook_elook", "elook_budget", "elook"),
    # the budget-aware information gain for the question (``eig_budget``) and EIG
    # respondents, with each imputation (``eig_eig_pool``: with the pool)
    **_imputation_family("eig_eig", "eig_budget", "eig"),
    # ``eig_eig_pool`` with the mixture weights re-fitted to the group
    # (:func:`elicitation.group.adapt_mixture_prior`), pool weight chosen once on validation
    "default_adapt": GroupMethod("eig_budget", "eig", "pool", adapt_prior=True),
    "eig_eig_none_adapt": GroupMethod("eig_budget", "eig", "none", adapt_prior=True),
    # the paper's question rule (summed over all members) with EIG respondents and no
    # imputation
    "greedy_eig": GroupMethod("eig", "eig", "none"),
    # the accuracy gain with one more answer ahead, with the chance the budget gives, over
    # all second questions (``eacc2``; its figures: docs/group.md §4)
    "eacc2_eacc2_pool": GroupMethod("eacc2_budget", "eacc2", "pool", online_pool=True),
    # the paper's question rule on a 10% member subsample (speed variant)
    "greedy10_random": GroupMethod("eig", "random", "none", subsample=0.1),
    # ``eig_eig_pool`` with the expected rise in target accuracy in place of the
    # information gain (``eacc_budget`` question, ``eacc`` respondents: the value of an
    # answer under 0-1 loss), for the question and respondents or the respondents only;
    # and without the GNN (their figures against ``eig_eig_pool``: docs/group.md §4).
    "eacc_eacc_pool": GroupMethod("eacc_budget", "eacc", "pool", online_pool=True),
    "eig_eacc_pool": GroupMethod("eig_budget", "eacc", "pool", online_pool=True),
    "eacc_eacc_none": GroupMethod("eacc_budget", "eacc", "none"),
    # ``eig_eig_pool`` with the expected Brier gain (proper, bounded) for the question
    # and respondents: ahead of ``eig_eig_pool`` at both budgets on CES (docs/group.md §4)
    "ebrier_ebrier_pool": GroupMethod("ebrier_budget", "ebrier", "pool", online_pool=True),
}
# methods that use the best validation weight as it is (``*_pool_val``)
VALIDATION_WEIGHT_METHODS = frozenset(n for n in GROUP_METHODS if n.endswith("_pool_val"))
DEFAULT_GROUP_METHODS = _DEFAULT_GROUP_METHODS  # defined where the CLI can read it cheaply
REPORTED = ("accuracy", "brier_sum", "perplexity", "log_loss")
STACK_FOLDS = 5  # cross-fitting folds of the validation users for the ``stack`` weights


class Fitted:
    """The fitted predictor, GNN and pool weight of one dataset."""

    def __init__(
        self,
        model: BeliefModel,
        gnn: TrainedGNN,
        view: GNNView,
        pool_weight: float,
        info: dict[str, Any],
        pool_gains: tuple[Tensor, Tensor] | None = None,
        calib: BeliefModel | None = None,
        val_responses: Tensor | None = None,
        val_folds: list[tuple[BeliefModel, Tensor]] | None = None,
    ) -> None:
        self.model = model
        self.gnn = gnn
        self.view = view
        self.pool_weight = pool_weight
        self.info = info
        self.pool_gains = pool_gains  # (sums [members, weights], counts) (pool_gain_rows)
        # the train-only fit of the same settings and the validation users' answers
        # ([V, I]): held-out evidence for the ``stack`` weights (fit_stack_on_validation)
        self.calib = calib
        self.val_responses = val_responses
        # cross-fitted belief models: (fit on train + the other folds of the validation
        # users, rows of ``val_responses`` it holds out), see :func:`prepare`
        self.val_folds = val_folds or []


def gnn_schema(ds: Dataset) -> GraphSchema:
    """Attributes = the dataset's demographics; questions = its askable questions."""
    return GraphSchema(
        tuple(ds.item(k).n_options for k in ds.demographics),
        tuple(ds.item(k).n_options for k in ds.questions),
        tuple(ds.demographics),
        tuple(ds.questions),
    )


def _dataset_key(ds: Dataset, settings: dict[str, Any]) -> str:
    h = hashlib.sha256()
    h.update(ds.responses.tobytes())
    h.update(repr(sorted((ds.split or {}).items())).encode())
    h.update(repr(sorted(settings.items())).encode())
    return h.hexdigest()[:16]


def _calibration_sample(
    ds: Dataset, y: Tensor, rows: Tensor, gen: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Validation members as they look in group rounds, for fitting the pool weight
    (:func:`elicitation.group.calibration_sample` with the demographics as attributes).

    Returns:
        ``(observed [M, I], truth [M, I])``.
    """
    n_demo = len(ds.demographics)
    return calibration_sample(y[rows], range(n_demo), torch.arange(n_demo, y.shape[1]), gen)


def _main_models(
    ds: Dataset,
    bank: ItemBank,
    y: Tensor,
    tr: Tensor,
    va: Tensor,
    n_classes: Sequence[int],
    gnn_config: GNNConfig,
    seed: int,
    cache: Path | None,
    key: str,
    info: dict[str, Any],
    log: Callable[[str], None],
) -> tuple[BeliefModel, TrainedGNN]:
    """The latent class model (train + validation) and the GNN, loaded from ``cache`` or
    fitted (then their fit times go into ``info`` and they are stored in ``cache``)."""
    model: BeliefModel | None = None
    gnn: TrainedGNN | None = None
    if cache is not None:
        lc_path, gnn_path = cache / f"{key}.lc", cache / f"{key}.gnn"
        if lc_path.is_file() and gnn_path.is_file():
            model = load_model(lc_path.read_bytes())
            gnn = TrainedGNN.from_bytes(gnn_path.read_bytes())
            log(f"loaded the fitted models from {cache} ({key})")
    if model is None or gnn is None:
        t0 = time.perf_counter()
        model = fit_latent_classes(
            y[tr], bank, val_responses=y[va], n_classes=n_classes, n_restarts=2, seed=seed
        )
        info["latent_class_fit_seconds"] = time.perf_counter() - t0
        log(
            f"latent classes: K = {model.metrics.get('n_classes')} "
            f"({info['latent_class_fit_seconds']:.0f} s)"
        )
        n_demo = len(ds.demographics)
        rows = torch.cat([tr, va])
        gnn = train_gnn(
            gnn_schema(ds),
            y[rows, :n_demo],
            y[rows, n_demo:],
            range(len(tr)),
            range(len(tr), len(rows)),
            gnn_config,
        )
        log(
            f"GNN: best epoch {gnn.history.best_epoch}, validation CE "
            f"{gnn.history.best_val_ce:.4f} ({gnn.history.seconds:.0f} s)"
        )
        if cache is not None:
            cache.mkdir(parents=True, exist_ok=True)
            (cache / f"{key}.lc").write_bytes(model.to_bytes())
            (cache / f"{key}.gnn").write_bytes(gnn.to_bytes())
    return model, gnn


def _calibration_model(
    y: Tensor,
    tr: Tensor,
    va: Tensor,
    bank: ItemBank,
    n_classes: Sequence[int],
    seed: int,
    cache: Path | None,
    key: str,
) -> BeliefModel:
    """A train-only latent class fit with the final fit's settings (validation users held
    out), loaded from or stored in ``cache``."""
    calib: BeliefModel | None = None
    calib_path = cache / f"{key}.lc_calib2" if cache is not None else None
    if calib_path is not None and calib_path.is_file():
        calib = load_model(calib_path.read_bytes())
    if calib is None:
        calib = fit_latent_classes(
            y[tr],
            bank,
            val_responses=y[va],
            n_classes=n_classes,
            n_restarts=2,
            seed=seed,
            refit_with_validation=False,
        )
        if calib_path is not None:
            calib_path.write_bytes(calib.to_bytes())
    return calib


def _fold_models(
    y: Tensor,
    tr: Tensor,
    va: Tensor,
    bank: ItemBank,
    n_classes: Sequence[int],
    seed: int,
    cache: Path | None,
    key: str,
) -> list[tuple[BeliefModel, Tensor]]:
    """``STACK_FOLDS`` cross-fitted latent class models, each with the validation users it
    holds out (loaded from or stored in ``cache``)."""
    perm = torch.randperm(len(va), generator=torch.Generator().manual_seed(seed + 23))
    folds: list[tuple[BeliefModel, Tensor]] = []
    for f in range(STACK_FOLDS):
        held = perm[f::STACK_FOLDS].sort().values
        rest = perm[torch.arange(len(perm)) % STACK_FOLDS != f].sort().values
        fpath = cache / f"{key}.lc_fold{f}of{STACK_FOLDS}" if cache is not None else None
        fm = load_model(fpath.read_bytes()) if fpath is not None and fpath.is_file() else None
        if fm is None:
            fm = fit_latent_classes(
                y[tr],
                bank,
                val_responses=y[va[rest]],
                n_classes=n_classes,
                n_restarts=2,
                seed=seed,
            )
            if fpath is not None:
                fpath.write_bytes(fm.to_bytes())
        folds.append((fm, held))
    return folds


def prepare(
    ds: Dataset,
    *,
    n_classes: Sequence[int] = (8, 16, 32),
    gnn_config: GNNConfig | None = None,
    seed: int = 0,
    cache: Path | None = None,
    log: Callable[[str], None] = print,
) -> Fitted:
    """Fit (or load from ``cache``) the latent class model, the GNN and the pool weight."""
    if ds.split is None:
        raise BenchmarkError(f"dataset {ds.name!r} has no user split (user_split.json)")
    gnn_config = gnn_config or GNNConfig(partial_mask="uniform", seed=seed)
    bank = ds.item_bank()
    y = torch.as_tensor(ds.matrix().astype("int64"))
    tr = torch.as_tensor(ds.user_indices("train_users"))
    va = torch.as_tensor(ds.user_indices("val_users"))
    if len(tr) < 3 or len(va) < 3:
        raise BenchmarkError("the group benchmark needs >= 3 training and validation users")
    settings = {"n_classes": tuple(n_classes), "gnn": repr(gnn_config), "seed": seed}
    key = _dataset_key(ds, settings)
    info: dict[str, Any] = {}
    model, gnn = _main_models(
        ds, bank, y, tr, va, n_classes, gnn_config, seed, cache, key, info, log
    )
    n_demo = len(ds.demographics)
    view = GNNView(gnn, list(range(n_demo)), list(range(n_demo, bank.n_items)))
    # The pool weight is fitted on validation members seen as in group rounds. The
    # validation users are in the final latent class fit (train + val), so the weight is
    # fitted with a train-only fit of the same K, for which they are held out (the GNN
    # used them only for early stopping); the weight is then used with the final model.
    # (same settings, the structure chosen on validation, parameters from training only)
    calib = _calibration_model(y, tr, va, bank, n_classes, seed, cache, key)
    # Cross-fitted belief models for the ``stack`` weights: at test time the belief
    # model is fitted on train + all validation users, so a train-only fit would make
    # the belief model look weaker on validation than it is on the group (and the GNN,
    # trained on train users only in both cases, relatively stronger). Fold f's model
    # is fitted like the final one — structure chosen on the other validation folds,
    # refit on train + those folds — and holds fold f out.
    folds = _fold_models(y, tr, va, bank, n_classes, seed, cache, key)
    gen = torch.Generator().manual_seed(seed + 17)
    obs, truth = _calibration_sample(ds, y, va, gen)
    p_b = calib.predict_batch(calib.initial_batch(obs), list(range(bank.n_items)))
    p_g = view.predict(obs, bank.n_items, bank.max_options)
    scored = truth[:, n_demo:]
    w, pool_info = choose_pool_weight(p_b[:, n_demo:], p_g[:, n_demo:], scored)
    losses = pool_info["log_loss"]
    log(
        f"pool weight of the GNN: {w:.2f} (best mean on validation "
        f"{pool_info['w_best_mean']:.2f}; gain {pool_info['gain']:.5f} +- "
        f"{pool_info['gain_se']:.5f} nats per answer)"
    )
    info.update(
        {
            "n_classes": model.metrics.get("n_classes"),
            "gnn_best_epoch": gnn.history.best_epoch,
            "gnn_best_val_ce": gnn.history.best_val_ce,
            "gnn_train_seconds": gnn.history.seconds,
            "gnn_partial_mask": gnn.config.partial_mask,
            "pool_weight": w,
            "pool_weight_best_on_validation": pool_info["w_best_mean"],
            "pool_val_gain": pool_info["gain"],
            "pool_val_gain_se": pool_info["gain_se"],
            "pool_val_gain_lcb": pool_info["lcb"],
            "pool_val_log_loss": losses,
        }
    )
    return Fitted(
        model,
        gnn,
        view,
        w,
        info,
        (pool_info["gain_sums"], pool_info["gain_counts"]),
        calib=calib,
        val_responses=y[va],
        val_folds=folds,
    )


def fit_stack_on_validation(
    fitted: Fitted,
    n_demographics: int,
    candidates: Sequence[int],
    targets: Sequence[int],
    method: GroupMethod,
    respondents: float | int,
    n_group: int,
    rounds: int,
    *,
    nonresponse: float = 0.0,
    seed: int = 0,
    keep_components: bool = False,
) -> tuple[Tensor, dict[str, Any]]:
    """Weights of the ``stack`` imputation per round, fitted on validation members.

    The validation users are run through the study's own rounds as a group — same
    candidate and target questions, same selectors, the same respondent share (a count
    is scaled by ``V / n_group``), demographics observed, answers from their data — with
    the train-only belief model (``fitted.calib``, for which they are held out; the GNN
    used them only for early stopping) choosing the questions and respondents. After
    ``r`` rounds with answers, the three :data:`~elicitation.group.STACK_COMPONENTS` of
    their target predictions and their true target answers give the weights of round
    ``r`` by maximum likelihood (:func:`~elicitation.group.fit_stack_weights`). The two
    belief components of a member come from the cross-fitted model of its fold
    (``fitted.val_folds``: fitted like the final model, on train + the other validation
    folds), so the belief model is held out but nearly as strong as the one the group
    gets. The selections of a ``stack`` method do not depend on its weights, so one pass
    gives every round's evidence. No test user is involved.

    Returns:
        ``(weights [r + 1, 3], {"nll": [...], "nll_belief": [...], "answers": [...],
        "seconds": s, "evidence": [(sums, counts)] * (r + 1)})`` (``r`` = rounds with
        answers; mean validation NLL per round at the fitted weights and of the belief
        model alone; ``evidence`` = each round's :func:`~elicitation.group.stack_gain_rows`
        per validation member, for the online shrinkage of ``default``; with
        ``keep_components`` also ``components``: each round's ``[3, V, T, O]``).
    """
    if fitted.calib is None or fitted.val_responses is None:
        raise BenchmarkError("stack weights need the train-only fit and validation answers")
    t0 = time.perf_counter()
    yv = fitted.val_responses
    n_val = int(yv.shape[0])
    share: float | int
    if isinstance(respondents, float):
        share = respondents
    else:
        share = max(1, min(n_val, int(round(respondents * n_val / max(1, n_group)))))
    start = torch.full_like(yv, -1)
    start[:, :n_demographics] = yv[:, :n_demographics]
    sim = GroupMethod(method.question, method.respondents, "stack", subsample=method.subsample)
    ge = GroupElicitation(
        fitted.calib,
        start,
        candidates,
        targets,
        sim,
        GroupBudget(share, rounds),
        gnn=fitted.view,
        response_prob=torch.full((n_val,), 1.0 - nonresponse, dtype=DTYPE),
        seed=seed,
    )
    gen = torch.Generator().manual_seed(seed + 31)
    truth = yv[:, list(targets)]
    weights: list[Tensor] = []
    evidence: list[tuple[Tensor, Tensor]] = []
    info: dict[str, Any] = {"nll": [], "nll_belief": [], "answers": []}

    def fit_now() -> None:
        comps = ge.stack_components()
        for fold_model, held in fitted.val_folds:  # belief components from held-out fits
            fc = ge.stack_components(model=fold_model)
            comps[0, held] = fc[0, held]
            comps[2, held] = fc[2, held]
        a, fi = fit_stack_weights(comps, truth)
        weights.append(a)
        evidence.append(stack_gain_rows(comps, truth, a))
        if keep_components:
            info.setdefault("components", []).append(comps)
        info["nll"].append(fi["nll"])
        info["nll_belief"].append(fi["nll_first"])
        info["answers"].append(fi["answers"])

    fit_now()
    for _ in range(rounds):
        q, who, _ = ge.plan()
        ans = yv[who, q].clone()
        if nonresponse > 0:
            ans[torch.rand(len(who), generator=gen) < nonresponse] = -1
        had = len(ge.answered_items)
        ge.apply(q, who, ans)
        if len(ge.answered_items) > had:
            fit_now()
        else:  # nobody answered: the weights stay those of the rounds with answers
            for k in ("nll", "nll_belief", "answers"):
                info[k].append(info[k][-1])
    info["seconds"] = time.perf_counter() - t0
    info["evidence"] = evidence
    return torch.stack(weights), info


def stack_holdout_check(
    dataset: str | Path | Dataset,
    respondent_budget: float,
    rounds: int,
    *,
    cache: Path | None = None,
    n_runs: int | None = None,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Out-of-sample check of the stack on validation users only (no test user is read).

    For each run, the validation users go through the study's rounds as in
    :func:`fit_stack_on_validation`; their members are split in two halves (cross-fit
    folds 0, 2, 4 and 1, 3); weights fitted on one half are scored on the other (and
    the other way round). Scored per round: mean log loss and accuracy of the held-out
    half's targets under the belief model alone ``(1, 0, 0)``, the GNN alone, the
    belief model with GNN guesses imputed ``(0, 0, 1)``, the pool ``(1 - w, w, 0)`` at
    the ``w`` of the grid ``{0, 0.05, ..., 1}`` best on the fitting half, and the fitted
    stack. Shows whether the stack's gain on validation holds out of sample within the
    validation population (it cannot show a shift to the group's population).

    Returns:
        ``{"rules": {name: {"log_loss": [rounds + 1], "accuracy": [rounds + 1]}}, ...}``
        (means over runs and both halves, weighted by scored answers).
    """
    ds = dataset if isinstance(dataset, Dataset) else load_dataset(dataset)
    fitted = prepare(ds, seed=seed, cache=cache, log=log)
    bank = fitted.model.item_bank
    n_demo = len(ds.demographics)
    n_test = len(ds.user_indices("test_users"))
    n_val = int(fitted.val_responses.shape[0]) if fitted.val_responses is not None else 0
    half = torch.zeros(n_val, dtype=torch.bool)
    for f, (_, held) in enumerate(fitted.val_folds):
        if f % 2 == 0:
            half[held] = True
    rules = ("belief", "gnn_only", "gnn_imputed", "pool_best_w", "stack")
    sums = {r: torch.zeros(rounds + 1, 2, dtype=torch.float64) for r in rules}
    count = torch.zeros(rounds + 1, dtype=torch.float64)
    runs = ds.runs[:n_runs] if n_runs else ds.runs
    for run in runs:
        cand, tgt = bank.indices(run.cand_qids), bank.indices(run.eval_qids)
        _, info = fit_stack_on_validation(
            fitted,
            n_demo,
            cand,
            tgt,
            GROUP_METHODS["default"],
            respondent_budget,
            n_test,
            rounds,
            seed=seed * 1000 + run.seed,
            keep_components=True,
        )
        assert fitted.val_responses is not None
        truth = fitted.val_responses[:, list(tgt)]
        for r, comps in enumerate(info["components"]):
            for fit_rows in (half, ~half):
                ev_rows = ~fit_rows
                y_fit = truth.clone()
                y_fit[~fit_rows] = -1
                y_ev = truth.clone()
                y_ev[~ev_rows] = -1
                a, _ = fit_stack_weights(comps, y_fit)
                w_pool, _ = fit_pool_weight(comps[0], comps[1], y_fit)
                weights = {
                    "belief": [1.0, 0.0, 0.0],
                    "gnn_only": [0.0, 1.0, 0.0],
                    "gnn_imputed": [0.0, 0.0, 1.0],
                    "pool_best_w": [1.0 - w_pool, w_pool, 0.0],
                    "stack": a.tolist(),
                }
                ok = y_ev >= 0
                yy = y_ev.clamp_min(0)[..., None]
                for name, w in weights.items():
                    p = stacked_pool(comps, w)
                    lp = p.gather(-1, yy).squeeze(-1).clamp_min(1e-12).log()
                    hit = (p.argmax(-1) == y_ev).double()
                    sums[name][r, 0] += float(-(lp[ok]).sum())
                    sums[name][r, 1] += float(hit[ok].sum())
                count[r] += float(ok.sum())
        log(f"run {run.seed}: stack holdout done")
    out: dict[str, Any] = {"dataset": ds.name, "respondent_budget": respondent_budget}
    out["rules"] = {
        name: {
            "log_loss": (sums[name][:, 0] / count).tolist(),
            "accuracy": (sums[name][:, 1] / count).tolist(),
        }
        for name in rules
    }
    out["answers_per_round"] = count.tolist()
    return out


def _score(
    ge: GroupElicitation, truth: Tensor, n_options: Tensor, curves: dict[str, list[float]]
) -> None:
    """Append the current target metrics of all members to ``curves``."""
    s: MetricSums = score_predictions(ge.predict_targets(), truth, n_options)
    means = s.means()
    curves["accuracy"].append(means["accuracy"])
    curves["brier_sum"].append(means["brier_sum"])
    curves["log_loss"].append(means["log_loss"])
    curves["perplexity"].append(math.exp(means["log_loss"]))


def _live_curves(
    fitted: Fitted,
    start: Tensor,
    truth: Tensor,
    cand: list[int],
    tgt: list[int],
    budget: GroupBudget,
    rounds: int,
    nonresponse: float,
    run_seed: int,
) -> dict[str, list[Any]]:
    """``live`` on one run: every round calls :func:`elicitation.group.plan_round` (the
    app's planner) on the closed rounds so far, as the plan job does, with the fitted
    models of ``default``; the metrics as :func:`_method_curves` gives them."""
    n_members = int(truth.shape[0])
    models = PlannerModels(fitted.model, fitted.view, fitted.pool_weight, fitted.pool_gains)
    tgt_truth = truth[:, tgt]
    n_opt_t = torch.tensor(fitted.model.item_bank.n_options)[tgt]
    rgen = torch.Generator().manual_seed(run_seed)
    response = torch.full((n_members,), 1.0 - nonresponse, dtype=DTYPE)
    closed: list[ClosedRound] = []

    def state() -> GroupState:
        return GroupState(start, cand, tgt, list(closed), response_prob=response)

    curves: dict[str, list[Any]] = {k: [] for k in (*REPORTED, "plan_seconds")}
    ge = replay(models, state(), budget, seed=run_seed)
    curves["pool_weight"] = [ge.pool_weight]
    _score(ge, tgt_truth, n_opt_t, curves)
    for _ in range(rounds):
        t0 = time.perf_counter()
        plan = plan_round(models, state(), budget, seed=run_seed)
        dt = time.perf_counter() - t0
        q, who = plan.question, plan.members
        ans = truth[who, q].clone()
        if nonresponse > 0:
            ans[torch.rand(len(who), generator=rgen) < nonresponse] = -1
        closed.append(ClosedRound(q, who, ans))
        ge = replay(models, state(), budget, seed=run_seed)
        curves["plan_seconds"].append(dt)
        curves["pool_weight"].append(ge.pool_weight)
        _score(ge, tgt_truth, n_opt_t, curves)
    return curves


def _method_curves(
    fitted: Fitted,
    name: str,
    n_demo: int,
    start: Tensor,
    truth: Tensor,
    cand: list[int],
    tgt: list[int],
    budget: GroupBudget,
    share: float | int,
    rounds: int,
    nonresponse: float,
    run_seed: int,
) -> dict[str, list[Any]]:
    """One method on one run: the metrics of :data:`REPORTED` after rounds ``0..rounds``
    and each round's planning time (plus the pool / stack weights in use), for the test
    members ``truth [M, I]`` starting from ``start [M, I]`` (their ``n_demo`` attributes)."""
    if name == "live":
        return _live_curves(fitted, start, truth, cand, tgt, budget, rounds, nonresponse, run_seed)
    model = fitted.model
    n_members = int(truth.shape[0])
    tgt_truth = truth[:, tgt]
    n_opt_t = torch.tensor(model.item_bank.n_options)[tgt]
    rgen = torch.Generator().manual_seed(run_seed)
    stack_w: Tensor | None = None
    stack_info: dict[str, Any] = {}
    if GROUP_METHODS[name].imputation == "stack":
        stack_w, stack_info = fit_stack_on_validation(
            fitted,
            n_demo,
            cand,
            tgt,
            GROUP_METHODS[name],
            share,
            n_members,
            rounds,
            nonresponse=nonresponse,
            seed=run_seed,
        )
    ge = GroupElicitation(
        model,
        start,
        cand,
        tgt,
        GROUP_METHODS[name],
        budget,
        gnn=fitted.view,
        pool_weight=(
            float(fitted.info.get("pool_weight_best_on_validation", fitted.pool_weight))
            if name in VALIDATION_WEIGHT_METHODS
            else fitted.pool_weight
        ),
        pool_evidence=fitted.pool_gains,
        stack_weights=stack_w,
        stack_evidence=stack_info["evidence"] if stack_w is not None else None,
        seed=run_seed,
        response_prob=torch.full((n_members,), 1.0 - nonresponse, dtype=DTYPE),
    )
    curves: dict[str, list[float]] = {k: [] for k in (*REPORTED, "plan_seconds")}
    pooled = GROUP_METHODS[name].imputation == "pool"
    if pooled:
        curves["pool_weight"] = [ge.pool_weight]
    if stack_w is not None:
        curves["stack_fit_seconds"] = [stack_info["seconds"]]
        curves["stack_val_nll"] = list(stack_info["nll"])
        curves["stack_val_nll_belief"] = list(stack_info["nll_belief"])
        curves["stack_weights"] = [ge.current_stack_weights().tolist()]
        curves["stack_lambda"] = [ge.stack_lambda]
    _score(ge, tgt_truth, n_opt_t, curves)
    for _ in range(rounds):
        t0 = time.perf_counter()
        q, who, scores = ge.plan()
        dt = time.perf_counter() - t0
        ans = truth[who, q].clone()
        if nonresponse > 0:
            ans[torch.rand(len(who), generator=rgen) < nonresponse] = -1
        ge.apply(q, who, ans, scores=scores, plan_seconds=dt)
        curves["plan_seconds"].append(dt)
        if pooled:
            curves["pool_weight"].append(ge.pool_weight)
        if stack_w is not None:
            curves["stack_weights"].append(ge.current_stack_weights().tolist())
            curves["stack_lambda"].append(ge.stack_lambda)
        _score(ge, tgt_truth, n_opt_t, curves)
    return curves


def _mean_curves(per_run: dict[str, list[list[Any]]]) -> dict[str, Any]:
    """Each curve of one method averaged over its runs (``[runs][rounds + 1]`` ->
    ``[rounds + 1]``), with the accuracy's standard deviation and per-run values."""
    res: dict[str, Any] = {}
    for k, runs_v in per_run.items():
        t = torch.tensor(runs_v, dtype=DTYPE)
        res[k] = t.mean(0).tolist() if t.numel() else []
        if k == "accuracy":
            res["accuracy_sd"] = t.std(0).tolist() if len(runs_v) > 1 else []
            # per run (runs.csv order) and round, for paired comparisons of methods
            res["accuracy_runs"] = t.tolist()
    return res


def _checked_share(
    methods: Sequence[str], respondent_budget: float | int, rounds: int, nonresponse: float
) -> float | int:
    """The respondents per round as :class:`GroupBudget` takes them (a float ``<= 1`` is a
    share, anything else a count), after checking the methods, rounds and nonresponse."""
    unknown = [m for m in methods if m not in GROUP_METHODS]
    if unknown:
        raise BenchmarkError(f"unknown group methods {unknown} (known: {sorted(GROUP_METHODS)})")
    if not methods:
        raise BenchmarkError("no method to run")
    if not 0.0 <= nonresponse < 1.0:
        raise BenchmarkError(f"nonresponse must be in [0, 1), got {nonresponse}")
    if rounds < 0:
        raise BenchmarkError(f"rounds must be >= 0, got {rounds}")
    if isinstance(respondent_budget, float) and respondent_budget <= 1.0:
        return float(respondent_budget)
    return int(respondent_budget)


def run_group(
    dataset: str | Path | Dataset,
    respondent_budget: float | int,
    rounds: int,
    methods: Sequence[str] = DEFAULT_GROUP_METHODS,
    *,
    nonresponse: float = 0.0,
    n_runs: int | None = None,
    seed: int = 0,
    fitted: Fitted | None = None,
    cache: Path | None = None,
    n_classes: Sequence[int] = (8, 16, 32),
    gnn_config: GNNConfig | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the group protocol; returns the ``result.json`` object.

    Args:
        dataset: folder (or loaded dataset) in the canonical format, with split and runs.
        respondent_budget: respondents per round: a share in ``(0, 1]`` or a count ``>= 1``
            (a float ``<= 1`` is a share).
        rounds: rounds per run (one question each).
        methods: names from :data:`GROUP_METHODS`.
        nonresponse: probability that an asked member does not answer.
        n_runs: use only the first runs (default: all of ``runs.csv``).
        seed: seed of fits and random choices.
        fitted: reuse fitted models (else :func:`prepare`).
        cache: folder to store / reuse fitted models.
        n_classes: candidate numbers of latent classes (chosen on validation users).
        gnn_config: GNN training settings (default: the paper's, uniform partial masks).
        log: progress messages.

    Returns:
        ``{"methods": {name: {"accuracy": [rounds + 1], "brier_sum": [...],
        "perplexity": [...], "log_loss": [...], "plan_seconds": [...],
        "accuracy_runs": [runs][rounds + 1]}}, ...}`` with metrics averaged over runs
        (``pool`` methods also give ``pool_weight``, the GNN's weight in use after each
        round; ``stack`` methods ``stack_weights``, ``stack_lambda``, ``stack_val_nll``,
        ``stack_val_nll_belief``, ``stack_fit_seconds``) (each run's metric is the mean
        over all scored (member, target) pairs).
    """
    share = _checked_share(methods, respondent_budget, rounds, nonresponse)
    budget = GroupBudget(share, rounds)
    ds = dataset if isinstance(dataset, Dataset) else load_dataset(dataset)
    if not ds.runs:
        raise BenchmarkError(f"dataset {ds.name!r} has no benchmark runs (runs.csv)")
    fitted = fitted or prepare(
        ds, n_classes=n_classes, gnn_config=gnn_config, seed=seed, cache=cache, log=log
    )
    bank = fitted.model.item_bank
    y = torch.as_tensor(ds.matrix().astype("int64"))
    te = torch.as_tensor(ds.user_indices("test_users"))
    truth = y[te]
    n_demo = len(ds.demographics)
    start = torch.full_like(truth, -1)
    start[:, :n_demo] = truth[:, :n_demo]
    runs = ds.runs[:n_runs] if n_runs else ds.runs
    per: dict[str, dict[str, list[list[float]]]] = {
        m: {k: [] for k in (*REPORTED, "plan_seconds")} for m in methods
    }
    for run in runs:
        cand = bank.indices(run.cand_qids)
        tgt = bank.indices(run.eval_qids)
        for name in methods:
            curves = _method_curves(
                fitted,
                name,
                n_demo,
                start,
                truth,
                cand,
                tgt,
                budget,
                share,
                rounds,
                nonresponse,
                seed * 1000 + run.seed,
            )
            for k, v in curves.items():
                per[name].setdefault(k, []).append(v)
        log(
            f"run {run.seed}: "
            + ", ".join(f"{m} {per[m]['accuracy'][-1][-1]:.4f}" for m in methods)
        )
    out: dict[str, Any] = {
        "dataset": ds.name,
        "respondent_budget": respondent_budget,
        "respondents_per_round": budget.per_round(len(te)),
        "rounds": rounds,
        "nonresponse": nonresponse,
        "n_runs": len(runs),
        "n_test_members": len(te),
        "setup": fitted.info,
        "methods": {},
    }
    for name in methods:
        out["methods"][name] = _mean_curves(per[name])
    return out


def sample_members(model: BeliefModel, n: int, gen: torch.Generator) -> Tensor:
    """``[n, I]`` synthetic members drawn from a fitted mixture (class, then answers).

    Needs a mixture with ``mu [K, I, O]`` and ``log_prior [K]`` (a latent class /
    persona mixture): ``theta ~ p(theta)``, ``y_i ~ mu[theta, i, :]``.
    """
    mu = getattr(model, "mu", None)
    log_prior = getattr(model, "log_prior", None)
    if not isinstance(mu, Tensor) or not isinstance(log_prior, Tensor):
        raise BenchmarkError("synthetic members need a mixture model (mu and log_prior)")
    theta = torch.multinomial(log_prior.exp(), n, replacement=True, generator=gen)
    probs = mu[theta].reshape(-1, mu.shape[-1])  # [n * I, O]
    return torch.multinomial(probs, 1, generator=gen).reshape(n, mu.shape[1])


def run_group_speed(
    dataset: str | Path | Dataset,
    *,
    sizes: Sequence[int] = (0, 10_000, 100_000),
    respondent_budget: float = 0.1,
    rounds: int = 4,
    relational_max: int = 100_000,
    train: bool = True,
    threads: int = 1,
    seed: int = 0,
    cache: Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Time GNN training and the planning of one round (question + respondents).

    ``sizes``: group sizes; ``0`` means the dataset's real test users, other sizes are
    synthetic members sampled from the fitted latent class model (demographics
    observed, one candidate question answered, as in round 2). The round timed is the
    first of a ``rounds``-round budget, so the lookahead gain of ``default`` sees a
    later answer (``q > 0``; with 1 round it would be the cheaper one-answer gain).
    Planning is timed for ``default`` (lookahead accuracy gain for the question and
    respondents), ``eig_eig_pool`` (the information gain)
    and, up to ``relational_max`` members, the paper's ``greedy_relational_gnn`` (group
    EIG question, k-means over GNN embeddings with k = the budget; two-level above
    :data:`elicitation.group.KMEANS_EXACT_MAX` point-centroid pairs). ``update_seconds`` is
    the time to apply the round's answers and predict every member's targets (the pool
    needs one GNN pass over the whole graph).
    """
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ds = dataset if isinstance(dataset, Dataset) else load_dataset(dataset)
        out: dict[str, Any] = {"dataset": ds.name, "threads": threads, "rounds": []}
        if train:
            y = torch.as_tensor(ds.matrix().astype("int64"))
            tr = torch.as_tensor(ds.user_indices("train_users"))
            va = torch.as_tensor(ds.user_indices("val_users"))
            rows = torch.cat([tr, va])
            n_demo = len(ds.demographics)
            t0 = time.perf_counter()
            g = train_gnn(
                gnn_schema(ds),
                y[rows, :n_demo],
                y[rows, n_demo:],
                range(len(tr)),
                range(len(tr), len(rows)),
                GNNConfig(partial_mask="uniform", seed=seed, num_threads=threads),
            )
            out["gnn_train_seconds"] = time.perf_counter() - t0
            out["gnn_epochs"] = len(g.history.val_ce)
            out["gnn_best_epoch"] = g.history.best_epoch
            log(f"GNN training: {out['gnn_train_seconds']:.1f} s, {out['gnn_epochs']} epochs")
        fitted = prepare(ds, seed=seed, cache=cache, log=log)
        model, bank = fitted.model, fitted.model.item_bank
        run = ds.runs[0]
        cand, tgt = bank.indices(run.cand_qids), bank.indices(run.eval_qids)
        n_demo = len(ds.demographics)
        gen = torch.Generator().manual_seed(seed)
        for size in sizes:
            if size == 0:
                y = torch.as_tensor(ds.matrix().astype("int64"))
                full = y[torch.as_tensor(ds.user_indices("test_users"))]
            else:
                full = sample_members(model, int(size), gen)
            start = torch.full_like(full, -1)
            start[:, :n_demo] = full[:, :n_demo]
            start[:, cand[0]] = full[:, cand[0]]
            entry: dict[str, Any] = {"members": int(full.shape[0])}
            for name in ("default", "eig_eig_pool", "greedy_relational_gnn"):
                if name == "greedy_relational_gnn" and full.shape[0] > relational_max:
                    continue
                ge = GroupElicitation(
                    model,
                    start,
                    cand[1:],
                    tgt,
                    GROUP_METHODS[name],
                    GroupBudget(respondent_budget, rounds),
                    gnn=fitted.view,
                    pool_weight=fitted.pool_weight,
                    pool_evidence=fitted.pool_gains,
                    seed=seed,
                )
                t0 = time.perf_counter()
                q, who, _ = ge.plan()
                plan_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                ge.apply(q, who, full[who, q])
                ge.predict_targets()
                upd_s = time.perf_counter() - t0
                entry[name] = {"plan_seconds": plan_s, "update_seconds": upd_s}
                log(
                    f"{entry['members']} members, {name}: plan {plan_s:.2f} s, update {upd_s:.2f} s"
                )
            out["rounds"].append(entry)
        return out
    finally:
        torch.set_num_threads(old)
