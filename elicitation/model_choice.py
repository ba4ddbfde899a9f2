"""CAPE in the benchmark: the ``cape_*`` methods and automatic model choice (``auto``).

* Benchmark methods ``cape_cooccurrence``, ``cape_linear``, ``cape_factor``: each CAPE
  world model (:mod:`models.cape_cooccurrence` ...) fitted on the training users with its
  hyper-parameters chosen on the validation users, asking by expected information gain
  about the run's targets (the ``eig`` criterion, as ``default``).
* ``auto`` (:func:`fit_auto`): fit every candidate family of the one table
  :data:`FAMILIES` (latent classes, the three CAPE models, the persona mixture and the
  persona + latent-class mixture ``mixed``; a family whose inputs are missing is skipped
  with its reason), replay the validation users through each one's simulated elicitation
  (the harness's :func:`~elicitation.bench.individual.simulate`, ``eig`` criterion,
  demographics observed, only the run's candidates asked) and keep the lowest target log
  loss averaged over budgets ``0..T`` (:func:`choose_model`); a stack of the candidates
  (:func:`stack_models`) replaces it only when it beats it out of fold by more than the
  standard error (:func:`stack_beats_single`). The app's ``belief_model = auto`` runs the
  same function (:func:`fit_belief_model`). The comparison table is stored in the chosen
  model's ``metrics["model_choice"]``.
* CAPE measures: :mod:`elicitation.cape_measures`.

Pure: no web framework, database or settings imports.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from elicitation.bench.individual import simulate
from elicitation.bench.methods import (
    FitContext,
    Method,
    MissingInputError,
    fit_latent_class_model,
    fit_persona_em,
    mix_personas_with_classes,
    persona_dictionary,
    register_method,
)
from elicitation.bench.metrics import LOG_FLOOR, score_predictions
from elicitation.criteria import get_criterion
from elicitation.errors import BenchmarkError, ElicitationError
from models.base import (
    MISSING,
    BeliefModel,
    ItemBank,
    TooFewRespondentsError,
    load_model,
    responses_hash,
)
from models.cape_common import split_rows
from models.cape_cooccurrence import CapeCooccurrence
from models.cape_factor import CapeFactor
from models.cape_linear import CapeLinear
from models.cape_mixture import StackedMixture, fit_stacking
from models.latent_class import fit_latent_classes

AUTO_BUDGET = 10
"""Questions per validation user in ``auto``'s simulated elicitation."""

STACK_MIN_RESPONDENTS = 10
"""``auto`` fits and scores the stack only when this many validation users answered a
target item: its out-of-fold score fits the weights on one half of them and scores the
other, and the rule's standard error is over users."""

AUTO_MIN_UNSPLIT = 10
"""``auto`` without validation users holds 20% of the training users out to compare the
candidates, from this many; with fewer it ships latent classes unscored."""

CAPE_FAMILIES = ("cape_cooccurrence", "cape_linear", "cape_factor")


def _val_or_none(ctx: FitContext) -> Tensor | None:
    return ctx.val if ctx.val.shape[0] else None


_MEMO: dict[tuple[Any, ...], BeliefModel] = {}

FIT_CACHE_DIR: Path | None = None
"""When set (``--fit-cache DIR``), fits of :func:`_memo` are also stored there as
``<sha256 of the key>.pt`` and reused by later processes (a benchmark split into several
commands fits each model once). Keys hold the family, the training and validation data
hashes and the seed, so a cached fit is only reused for identical data; delete the folder
after changing a model's code."""


@contextlib.contextmanager
def fits_scope() -> Iterator[None]:
    """Forget, on exit, the fits :func:`_memo` kept inside the block (the app's jobs:
    a long-running worker keeps no fits of past studies)."""
    before = set(_MEMO)
    try:
        yield
    finally:
        for key in set(_MEMO) - before:
            _MEMO.pop(key, None)


def _memo(ctx: FitContext, name: str, build: Callable[[], BeliefModel], *extra: Any) -> BeliefModel:
    """``ctx.cached`` plus a process-wide memo keyed by the training data, so that
    :func:`cape_measures` reuses the fits of the benchmark run before it (fits are
    deterministic functions of the data and the seed), plus the optional disk cache
    :data:`FIT_CACHE_DIR`."""
    key = (
        name,
        responses_hash(ctx.train, ctx.item_bank),
        responses_hash(ctx.val, ctx.item_bank),
        ctx.base_seed,
        *extra,
    )

    def build_once() -> BeliefModel:
        if key not in _MEMO:
            path = None
            if FIT_CACHE_DIR is not None:
                digest = hashlib.sha256(repr(key).encode()).hexdigest()[:32]
                path = Path(FIT_CACHE_DIR) / f"{name}-{digest}.pt"
            if path is not None and path.exists():
                _MEMO[key] = load_model(path.read_bytes())
            else:
                _MEMO[key] = build()
                if path is not None:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    tmp = path.with_suffix(".tmp")
                    tmp.write_bytes(_MEMO[key].to_bytes())
                    tmp.replace(path)
        return _MEMO[key]

    return ctx.cached(name if not extra else f"{name}:{extra}", build_once)


def _fit_cape(name: str, model: Any, **fixed: Any) -> Callable[[FitContext], BeliefModel]:
    """The fit of the CAPE family ``name``: ``model.fit`` on the training users with its
    hyper-parameters chosen on the validation users, memoised (``ctx.options[name]`` adds
    keyword arguments to ``fixed``).

    Example::

        fit = CAPE_FITS["cape_linear"]
        belief = fit(ctx)  # CapeLinear on ctx.train, d and calibration chosen on ctx.val
    """

    def fit(ctx: FitContext) -> BeliefModel:
        return _memo(
            ctx,
            name,
            lambda: model.fit(
                ctx.train,
                ctx.item_bank,
                validation=_val_or_none(ctx),
                seed=ctx.base_seed,
                **{**fixed, **ctx.options.get(name, {})},
            ),
        )

    fit.__name__ = f"fit_{name}"
    return fit


CAPE_FITS: dict[str, Callable[[FitContext], BeliefModel]] = {
    "cape_cooccurrence": _fit_cape("cape_cooccurrence", CapeCooccurrence),
    "cape_linear": _fit_cape("cape_linear", CapeLinear),
    "cape_factor": _fit_cape("cape_factor", CapeFactor, progress=False),
}
"""The three CAPE families' fits (docs/cape.md): co-occurrence statistics, factor
analysis, and the Pyro latent factor model."""


def fit_latent_classes_train_only(ctx: FitContext) -> BeliefModel:
    """Latent classes fitted on the training users only (``K`` chosen on validation, no
    refit on training + validation): ``auto`` scores candidates on the validation users,
    so no candidate may have been fitted on them."""

    def build() -> BeliefModel:
        kw = dict(getattr(ctx, "options", {}).get("latent_classes", {}))
        kw["refit_with_validation"] = False
        return fit_latent_classes(
            ctx.train, ctx.item_bank, val_responses=_val_or_none(ctx), seed=ctx.base_seed, **kw
        )

    return _memo(ctx, "latent_classes_train_only", build)


def _dictionary_key(mu: Tensor) -> str:
    return hashlib.sha256(mu.contiguous().numpy().tobytes()).hexdigest()[:16]


def fit_persona_candidate(ctx: FitContext) -> BeliefModel:
    """The persona mixture over the run's persona dictionary
    (:func:`~elicitation.bench.methods.persona_dictionary`), prior by EM on the training
    users' non-target answers."""
    mu = persona_dictionary(ctx)
    return _memo(ctx, "persona_mixture", lambda: fit_persona_em(ctx, mu), _dictionary_key(mu))


def _fit_mixed_with(
    lc_fit: Callable[[FitContext], BeliefModel], key: str
) -> Callable[[FitContext], BeliefModel]:
    def fit(ctx: FitContext) -> BeliefModel:
        mu = persona_dictionary(ctx)  # raises MissingInputError before the latent-class fit
        return _memo(
            ctx, key, lambda: mix_personas_with_classes(ctx, lc_fit(ctx), mu), _dictionary_key(mu)
        )

    return fit


def fit_latent_classes_production(ctx: FitContext) -> BeliefModel:
    """``default``'s latent classes (refitted on training + validation users), memoised."""
    return _memo(ctx, "latent_classes_production", lambda: fit_latent_class_model(ctx))


@dataclass(frozen=True)
class Family:
    """One candidate family of ``auto``.

    Attributes:
        name: the candidate's name in the comparison table.
        fit: the fit scored on the validation users (fitted on the training users only).
        production: the fit shipped once chosen (may also use the validation users).
        needs: what the fit needs beyond the history (for the docs).
    """

    name: str
    fit: Callable[[FitContext], BeliefModel]
    production: Callable[[FitContext], BeliefModel]
    needs: str = ""


FAMILIES: dict[str, Family] = {}
"""The candidates of ``auto``, in table order. A fit that raises
:class:`~elicitation.bench.methods.MissingInputError` is skipped, with its reason in the
chosen model's ``metrics["model_choice_skipped"]``."""


def register_family(family: Family) -> Family:
    """Add (or replace) a candidate family of ``auto``."""
    FAMILIES[family.name] = family
    return family


for _family in (
    Family("latent_classes", fit_latent_classes_train_only, fit_latent_classes_production),
    *(Family(name, fit, fit) for name, fit in CAPE_FITS.items()),
    Family("persona_mixture", fit_persona_candidate, fit_persona_candidate, "a persona dictionary"),
    Family(
        "mixed",
        _fit_mixed_with(fit_latent_classes_train_only, "mixed_train_only"),
        _fit_mixed_with(fit_latent_classes_production, "mixed_production"),
        "a persona dictionary",
    ),
):
    register_family(_family)

AUTO_CANDIDATES = tuple(FAMILIES)


@dataclass
class ModelChoice:
    """The outcome of :func:`choose_model`.

    Attributes:
        chosen: name of the kept model.
        model: the kept model.
        table: one row per candidate: ``name``, ``family``, ``log_loss`` (target log loss
            on validation users after ``0..T`` questions), ``mean_log_loss``,
            ``accuracy`` (same indexing), ``seconds`` (simulation time).
        user_loss: name -> ``[M]`` each scored validation respondent's target log loss
            (summed over its scored targets, averaged over ``0..T`` questions); for a
            stack, scored out of fold (:func:`stack_models`).
        n_scored: scored (respondent, target) pairs per question count: the mean score is
            ``user_loss.sum() / n_scored``.
    """

    chosen: str
    model: BeliefModel
    table: list[dict[str, Any]]
    user_loss: dict[str, Tensor] = dataclasses.field(default_factory=dict)
    n_scored: int = 0


def user_log_loss(preds: Sequence[Tensor], truth: Tensor) -> Tensor:
    """``[B]`` each respondent's target log loss summed over its scored targets and
    averaged over the predictions ``preds`` (``[B, T, O]`` after ``0..T`` questions).

    ``user_log_loss(preds, truth).sum() / (truth >= 0).sum()`` is the mean over ``n`` of
    the pooled log loss of :func:`~elicitation.bench.metrics.score_predictions`.
    """
    valid = truth >= 0
    y = truth.clamp_min(0).unsqueeze(-1)
    out = torch.zeros(truth.shape[0], dtype=torch.float64)
    for p in preds:
        p_true = p.to(torch.float64).gather(-1, y).squeeze(-1)
        out += (-p_true.clamp_min(LOG_FLOOR).log() * valid).sum(-1)
    return out / len(preds)


def stack_beats_single(stack: Tensor, single: Tensor, n_scored: int) -> dict[str, Any]:
    """The rule of ``auto``: a stack ships only when it beats the best single candidate
    by more than the standard error of the difference over validation respondents.

    With ``d_u = single_u - stack_u`` (per-respondent losses of :func:`user_log_loss`,
    ``M`` respondents, ``n_scored`` scored pairs), ``gain = sum_u d_u / n_scored`` is the
    difference of the mean scores and ``se = sqrt(M) * sd(d) / n_scored`` its standard
    error. Returns ``{"gain", "se", "stack": gain > se}``.

    Example: ``stack_beats_single(torch.tensor([1.0, 1.0]), torch.tensor([1.1, 0.9]), 2)``
    gives gain 0 and se 0.1: the single candidate ships.
    """
    d = (single - stack).to(torch.float64)
    m = d.numel()
    gain = float(d.sum()) / n_scored
    se = math.sqrt(m) * float(d.std()) / n_scored if m > 1 else math.inf
    return {"gain": gain, "se": se, "stack": bool(gain > se)}


def choose_model(
    models: Mapping[str, BeliefModel],
    responses: Tensor,
    *,
    observed_items: Sequence[int],
    candidates: Sequence[int],
    targets: Sequence[int],
    budget: int = AUTO_BUDGET,
    criterion: str = "eig",
) -> ModelChoice:
    """Keep the model with the lowest mean target log loss in a simulated elicitation.

    Each respondent of ``responses`` starts with ``observed_items`` observed, is asked up
    to ``budget`` of the ``candidates`` it answered (chosen by ``criterion``), and its
    known ``targets`` answers are scored after ``0..budget`` questions. The score of a
    model is ``mean_n log_loss[n]``; ties go to the first model in ``models``.

    Args:
        models: candidate name -> fitted model (same item bank).
        responses: ``LongTensor [N, I]`` answers of validation respondents.
        observed_items: items known for free (demographics).
        candidates: askable items; targets: scored items.
        budget: questions per respondent.
        criterion: selection-criterion name (registry of :mod:`elicitation.criteria`).

    Raises:
        ElicitationError: no models, or no respondent with a target answer.
    """
    if not models:
        raise ElicitationError("choose_model: no candidate models")
    tgt = [int(t) for t in targets]
    cand = [int(c) for c in candidates]
    truth = responses[:, tgt]
    users = (truth >= 0).any(1)
    if not bool(users.any()):
        raise ElicitationError("choose_model: no validation respondent answered a target item")
    rows = responses[users]
    observed = torch.full_like(rows, MISSING)
    obs_items = [int(i) for i in observed_items]
    observed[:, obs_items] = rows[:, obs_items]
    answers = rows[:, cand]
    n_opt = torch.tensor([next(iter(models.values())).item_bank.n_options[t] for t in tgt])
    steps = min(budget, len(cand))
    table: list[dict[str, Any]] = []
    user_loss: dict[str, Tensor] = {}
    for name, model in models.items():
        t0 = time.perf_counter()
        preds, _ = simulate(model, get_criterion(criterion), observed, cand, answers, tgt, steps)
        user_loss[name] = user_log_loss(preds, truth[users])
        loss, acc = [], []
        for p in preds:
            means = score_predictions(p, truth[users], n_opt).means()
            loss.append(means["log_loss"])
            acc.append(means["accuracy"])
        table.append(
            {
                "name": name,
                "family": model.family,
                "mean_log_loss": sum(loss) / len(loss),
                "log_loss": loss,
                "accuracy": acc,
                "seconds": round(time.perf_counter() - t0, 3),
            }
        )
    best = min(range(len(table)), key=lambda k: table[k]["mean_log_loss"])
    for k, row in enumerate(table):
        row["chosen"] = k == best
    chosen = table[best]["name"]
    n_scored = int((truth[users] >= 0).sum())
    return ModelChoice(chosen, models[chosen], table, user_loss, n_scored)


def _shared_path(
    uniform: StackedMixture,
    criterion: str,
    observed: Tensor,
    cand: list[int],
    answers: Tensor,
    tgt: list[int],
    steps: int,
) -> tuple[list[Tensor], list[Tensor]]:
    """Replay the users through ``uniform`` (``criterion`` picks, ``answers [M, C]`` of
    ``cand``): each component's target predictives ``[K, M, T, O]`` and the log-likelihoods
    ``[M, K]`` of the answers after ``n = 0..steps`` questions."""
    bank = uniform.item_bank
    _, asked = simulate(uniform, get_criterion(criterion), observed, cand, answers, tgt, steps)
    pos = torch.full((bank.n_items,), -1, dtype=torch.long)
    pos[torch.tensor(cand)] = torch.arange(len(cand))
    state = uniform.initial_batch(observed)
    preds = [uniform.component_predictions(state, tgt)]
    logliks = [state.loglik]
    b = torch.arange(observed.shape[0])
    for step in range(steps):
        item = asked[:, step]
        option = torch.where(
            item >= 0, answers[b, pos[item.clamp_min(0)].clamp_min(0)], torch.full_like(item, -1)
        )
        item = torch.where(item >= 0, item, torch.full_like(item, cand[0]))  # option -1: skip
        state = uniform.update_batch(state, item, option)
        preds.append(uniform.component_predictions(state, tgt))
        logliks.append(state.loglik)
    return preds, logliks


def _stacking_table(
    names: list[str],
    comps: list[BeliefModel],
    kept: list[int],
    preds: list[Tensor],
    preds_k: list[Tensor],
    logliks_k: list[Tensor],
    truth: Tensor,
    n_opt: Tensor,
    theta: Tensor,
    gamma: Tensor,
    seconds: float,
) -> list[dict[str, Any]]:
    """The :func:`stack_models` table: one row per candidate, then the mixture's."""
    kept_names = [names[m] for m in kept]
    table: list[dict[str, Any]] = []
    for m, name in enumerate(names):
        loss, acc = [], []
        for p in preds:
            means = score_predictions(p[m], truth, n_opt).means()
            loss.append(means["log_loss"])
            acc.append(means["accuracy"])
        table.append(
            {
                "name": name,
                "family": comps[m].family,
                "log_loss": loss,
                "accuracy": acc,
                "in_mixture": m in kept,
            }
        )
    loss, acc = [], []
    for n, (p, ll) in enumerate(zip(preds_k, logliks_k, strict=True)):
        k = min(n, theta.shape[0] - 1)
        w = torch.softmax(theta[k][None, :] + gamma[k] * ll, -1)
        means = score_predictions(torch.einsum("bm,mbto->bto", w, p), truth, n_opt).means()
        loss.append(means["log_loss"])
        acc.append(means["accuracy"])
    table.append(
        {
            "name": "stacked_mixture",
            "family": StackedMixture.family,
            "log_loss": loss,
            "accuracy": acc,
            "gamma": gamma.tolist(),
            "weights_by_n": {
                name: [round(float(row[m]), 4) for row in torch.softmax(theta, -1)]
                for m, name in enumerate(kept_names)
            },
            "seconds": seconds,
        }
    )
    for row in table:
        row["mean_log_loss"] = sum(row["log_loss"]) / len(row["log_loss"])
        row["chosen"] = row["name"] == "stacked_mixture"
    return table


def stack_models(
    models: Mapping[str, BeliefModel],
    responses: Tensor,
    *,
    observed_items: Sequence[int],
    candidates: Sequence[int],
    targets: Sequence[int],
    budget: int = AUTO_BUDGET,
    criterion: str = "eig",
    gammas: Sequence[float] = (0.0, 0.25, 0.5, 1.0, 2.0),
    prune_below: float = 0.02,
) -> ModelChoice:
    """Fit a :class:`~models.cape_mixture.StackedMixture` of ``models`` on validation users.

    1. The equal-weight mixture of all candidates replays the validation respondents
       through a simulated elicitation (``criterion`` on the targets, ``observed_items``
       free, only answered ``candidates`` asked, ``budget`` questions).
    2. Along that one path (every candidate conditioned on the same answers, as inside
       the mixture), each candidate's target predictive and its log-likelihood of the
       answers are recorded after ``n = 0..budget`` questions.
    3. :func:`~models.cape_mixture.fit_stacking` fits the weights per ``n`` and the
       evidence temperature ``gamma`` that minimise the mixture's target log loss.
    4. Candidates whose average weight on these users stays below ``prune_below`` at
       every ``n`` are dropped and the weights refitted without them: they change the
       predictions by less than that share and would cost a lookahead per question.

    The table has one row per candidate and one for the mixture (``name``, ``family``,
    ``log_loss`` and ``accuracy`` after ``0..budget`` questions on that shared path,
    ``mean_log_loss``, ``chosen``); the mixture's row is in-sample (its weights were
    fitted on these users), which is why the benchmark scores it on test users only.

    Raises:
        ElicitationError: no models, or no respondent with a target answer.
    """
    if not models:
        raise ElicitationError("stack_models: no candidate models")
    responses = torch.as_tensor(responses, dtype=torch.long)
    tgt = [int(t) for t in targets]
    cand = [int(c) for c in candidates]
    truth = responses[:, tgt]
    users = (truth >= 0).any(1)
    if not bool(users.any()):
        raise ElicitationError("stack_models: no validation respondent answered a target item")
    rows = responses[users]
    truth = truth[users]
    observed = torch.full_like(rows, MISSING)
    obs_items = [int(i) for i in observed_items]
    observed[:, obs_items] = rows[:, obs_items]
    answers = rows[:, cand]
    names = list(models)
    comps = [models[n] for n in names]
    bank = comps[0].item_bank
    n_opt = torch.tensor([bank.n_options[t] for t in tgt])
    steps = min(budget, len(cand))
    t0 = time.perf_counter()
    uniform = StackedMixture(bank, comps, names, torch.zeros(1, len(comps)))
    preds, logliks = _shared_path(uniform, criterion, observed, cand, answers, tgt, steps)
    theta, gamma, info = fit_stacking(preds, truth, logliks, gammas=gammas)
    mean_w = torch.stack(
        [
            torch.softmax(theta[n][None, :] + gamma[n] * ll, -1).mean(0)
            for n, ll in enumerate(logliks)
        ]
    )  # [K + 1, M] average weight of each candidate on the validation users
    kept = [m for m in range(len(names)) if float(mean_w[:, m].max()) >= prune_below]
    if len(kept) < len(names):  # refit without the candidates that carry (almost) nothing
        idx = torch.tensor(kept)
        preds_k = [p[idx] for p in preds]
        logliks_k = [ll[:, idx] for ll in logliks]
        theta, gamma, info = fit_stacking(preds_k, truth, logliks_k, gammas=gammas)
    else:
        preds_k, logliks_k = preds, logliks
    kept_names = [names[m] for m in kept]
    mixture = StackedMixture(bank, [comps[m] for m in kept], kept_names, theta, gamma)
    seconds = round(time.perf_counter() - t0, 3)
    table = _stacking_table(
        names, comps, kept, preds, preds_k, logliks_k, truth, n_opt, theta, gamma, seconds
    )
    mixture.metrics = {"stacking": {k: v for k, v in info.items() if k != "log_loss"}}
    oof = _out_of_fold_loss(preds, logliks, truth, gammas)
    n_scored = int((truth >= 0).sum())
    table[-1]["mean_log_loss_out_of_fold"] = float(oof.sum()) / n_scored
    return ModelChoice("stacked_mixture", mixture, table, {"stacked_mixture": oof}, n_scored)


def _out_of_fold_loss(
    preds: list[Tensor], logliks: list[Tensor], truth: Tensor, gammas: Sequence[float]
) -> Tensor:
    """``[B]`` each validation respondent's stacked target log loss (:func:`user_log_loss`)
    with the stacking weights fitted on the other half of the respondents (two folds, a
    fixed seeded split), along the shared path of :func:`_shared_path`: an honest score
    of the stack, whose in-sample loss is at most every candidate's by construction."""
    b = truth.shape[0]
    fold = torch.zeros(b, dtype=torch.bool)
    fold[torch.randperm(b, generator=torch.Generator().manual_seed(0))[: b // 2]] = True
    out = torch.zeros(b, dtype=torch.float64)
    for held in (fold, ~fold):
        fit_on = ~held
        if not bool(held.any()) or not bool(fit_on.any()):
            continue
        theta, gamma, _ = fit_stacking(
            [p[:, fit_on] for p in preds],
            truth[fit_on],
            [ll[fit_on] for ll in logliks],
            gammas=gammas,
        )
        mixed = []
        for n, (p, ll) in enumerate(zip(preds, logliks, strict=True)):
            k = min(n, theta.shape[0] - 1)
            w = torch.softmax(theta[k][None, :] + gamma[k] * ll[held], -1)
            mixed.append(torch.einsum("bm,mbto->bto", w, p[:, held]))
        out[held] = user_log_loss(mixed, truth[held])
    return out


def comparison_rows(table: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The short form of a :func:`stack_models` table shown to researchers: per model its
    validation target log loss with no question, after ``T`` questions, averaged over
    ``0..T``, and whether it is the model used."""
    out = []
    for row in table:
        out.append(
            {
                "name": row["name"],
                "log_loss_0": row["log_loss"][0],
                "log_loss_T": row["log_loss"][-1],
                "mean_log_loss": row["mean_log_loss"],
                "chosen": bool(row.get("chosen")),
            }
        )
    return out


def fit_auto(ctx: FitContext) -> BeliefModel:
    """``auto``: the best single candidate family, or their stack when it is clearly better.

    1. Every family of :data:`FAMILIES` (or ``ctx.options["auto"]["families"]``) is fitted
       on the training users; a family whose inputs are missing (no persona dictionary)
       is skipped with its reason.
    2. :func:`choose_model` replays the validation users through each candidate's own
       simulated elicitation (``eig`` on the targets, demographics observed,
       :data:`AUTO_BUDGET` questions) and scores target log loss averaged over
       ``0..AUTO_BUDGET`` questions; the lowest is the best single candidate.
    3. With two or more candidates and at least :data:`STACK_MIN_RESPONDENTS` scored
       validation users, :func:`stack_models` fits a stacked mixture and scores it out of
       fold (weights fitted on the other half of the validation users).
       The stack ships only when :func:`stack_beats_single` says it beats the best single
       candidate by more than the standard error of the difference over validation users;
       otherwise the best single candidate ships.

    The shipped model is the chosen candidate's production fit (latent classes refitted on
    training + validation users like ``default``; the others as scored), or the stack of
    production fits. Its ``metrics``: ``auto_chosen``, ``model_choice`` (the comparison
    table, short form, skipped candidates with their reason), ``model_choice_skipped``
    (``{name: reason}``), ``model_choice_rule`` (``gain``, ``se``, ``best_single``) and
    ``auto_table`` (curves).

    Raises:
        BenchmarkError: no validation users.
        ElicitationError: every candidate was skipped.
    """
    if ctx.val.shape[0] == 0:
        raise BenchmarkError("auto needs validation users to choose a model")
    mu = ctx.options.get("personas", {}).get("mu")
    key = (
        tuple(ctx.candidates),
        tuple(ctx.targets),
        tuple(ctx.options.get("auto", {}).get("families") or FAMILIES),
        None if mu is None else _dictionary_key(torch.as_tensor(mu, dtype=torch.float64)),
        repr(sorted(ctx.options.get("latent_classes", {}).items())),
    )
    return _memo(ctx, "auto", lambda: _fit_auto(ctx), *key)


def _fit_auto(ctx: FitContext, progress: Callable[[float, str], None] | None = None) -> BeliefModel:
    names = ctx.options.get("auto", {}).get("families") or tuple(FAMILIES)
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise ElicitationError(f"auto: unknown families {unknown} (known: {', '.join(FAMILIES)})")
    models: dict[str, BeliefModel] = {}
    skipped: dict[str, str] = {}
    for i, name in enumerate(names):
        if progress is not None:
            progress(0.8 * i / len(names), f"auto: fitting {name} ({i + 1} of {len(names)})")
        try:
            models[name] = FAMILIES[name].fit(ctx)
        except (MissingInputError, TooFewRespondentsError) as exc:
            skipped[name] = str(exc)
    if not models:
        raise ElicitationError(f"auto: every candidate was skipped ({skipped})")
    skipped_rows = [
        {
            "name": f"{name} (skipped: {why})",
            "family": name,
            "skipped": why,
            "log_loss_0": None,
            "log_loss_T": None,
            "mean_log_loss": None,
            "chosen": False,
        }
        for name, why in skipped.items()
    ]
    scored = int((ctx.val[:, list(ctx.targets)] >= 0).any(1).sum())
    if scored == 0:
        why = "no validation respondent has answered a target item yet: nothing to compare on"
        return _unscored_choice(ctx, list(models), skipped, skipped_rows, why)
    kw: dict[str, Any] = {
        "observed_items": ctx.demographics,
        "candidates": ctx.candidates,
        "targets": ctx.targets,
    }
    if progress is not None:
        progress(0.8, "auto: comparing the models on validation respondents, refitting the chosen")
    singles = choose_model(models, ctx.val, **kw)
    best = singles.chosen
    table = [dict(row) for row in singles.table]
    rule: dict[str, Any] = {"best_single": best, "gain": None, "se": None, "stack": False}
    stack: ModelChoice | None = None
    if len(models) > 1 and scored < STACK_MIN_RESPONDENTS:
        rule["stack_skipped"] = (
            f"{scored} validation respondents answered a target item; the stack is "
            f"compared from {STACK_MIN_RESPONDENTS}"
        )
    elif len(models) > 1:
        stack = stack_models(models, ctx.val, **kw)
        rule.update(
            stack_beats_single(
                stack.user_loss["stacked_mixture"], singles.user_loss[best], singles.n_scored
            )
        )
        row = dict(stack.table[-1])
        row["mean_log_loss"] = row["mean_log_loss_out_of_fold"]
        table.append(row)
    for row in table:
        row["chosen"] = row["name"] == ("stacked_mixture" if rule["stack"] else best)
    if rule["stack"]:
        assert stack is not None and isinstance(stack.model, StackedMixture)
        fitted = stack.model
        production = [FAMILIES[n].production(ctx) for n in fitted.names]
        model: BeliefModel = StackedMixture(
            ctx.item_bank, production, fitted.names, fitted.log_weights, fitted.gamma
        )
        extra = dict(fitted.metrics)
        chosen = "stacked_mixture"
    else:
        model = copy.copy(FAMILIES[best].production(ctx))  # the fit is shared (memo, cache)
        extra = dict(model.metrics or {})
        chosen = best
    model.metrics = {
        **extra,
        "auto_table": {"seed": ctx.seed, "chosen": chosen, "table": table},
        "auto_chosen": chosen,
        "model_choice": comparison_rows(table) + skipped_rows,
        "model_choice_skipped": skipped,
        "model_choice_rule": rule,
        "model_choice_respondents": scored,
    }
    return model


def _unscored_choice(
    ctx: FitContext,
    fitted: Sequence[str],
    skipped: dict[str, str],
    skipped_rows: list[dict[str, Any]],
    why: str,
) -> BeliefModel:
    """``auto`` with nothing to compare the candidates on (a study's first few
    respondents: none for validation, or none of them answered a target item): the first
    candidate of ``fitted`` (table order: latent classes) ships, and its ``metrics`` say
    why (``model_choice_rule["unscored"]``). The app's promotion still scores it on
    held-out respondents before it replaces the active model."""
    name = fitted[0]
    model = copy.copy(FAMILIES[name].production(ctx))
    rows = [
        {
            "name": n,
            "log_loss_0": None,
            "log_loss_T": None,
            "mean_log_loss": None,
            "chosen": n == name,
        }
        for n in fitted
    ]
    model.metrics = {
        **dict(model.metrics or {}),
        "auto_table": {"seed": ctx.seed, "chosen": name, "table": []},
        "auto_chosen": name,
        "model_choice": rows + skipped_rows,
        "model_choice_skipped": skipped,
        "model_choice_rule": {
            "best_single": name,
            "gain": None,
            "se": None,
            "stack": False,
            "unscored": why,
        },
        "model_choice_respondents": 0,
    }
    return model


BELIEF_MODEL_CHOICES = (
    "default",
    "auto",
    "cape_cooccurrence",
    "cape_linear",
    "cape_factor",
    "persona_mixture",
)
"""Values of a study's ``belief_model`` setting: ``default`` = latent classes, ``auto`` =
the model choice of :func:`fit_auto`, a CAPE family, or ``persona_mixture`` (the
study's language-model persona prior; built by the app, which holds the distributions)."""


def fit_belief_model(
    kind: str,
    train: Tensor,
    val: Tensor | None,
    item_bank: ItemBank,
    *,
    demographics: Sequence[int] = (),
    candidates: Sequence[int] = (),
    targets: Sequence[int] = (),
    seed: int = 0,
    latent_class_options: Mapping[str, Any] | None = None,
    fit_options: Mapping[str, Mapping[str, Any]] | None = None,
    progress: Callable[[float, str], None] | None = None,
    personas: Tensor | None = None,
) -> BeliefModel:
    """Fit the belief model ``kind`` (one of :data:`BELIEF_MODEL_CHOICES` but
    ``persona_mixture``) on a study's history: what the app's "fit model" job runs.

    Args:
        kind: the study's ``belief_model`` setting.
        train: ``LongTensor [N, I]`` historical answers; val: ``[N_val, I]`` or ``None``.
        item_bank: the study's items.
        demographics / candidates / targets: item indices of the study's attribute,
            question and target items (``auto`` simulates elicitations with them).
        seed: seeds the fits and, for ``auto`` without validation users, the 20% of
            ``train`` held out to fit the mixture weights.
        latent_class_options: keyword arguments of ``fit_latent_classes`` (e.g.
            ``n_classes``).
        fit_options: keyword arguments of the CAPE fits by family, e.g.
            ``{"cape_factor": {"dims": (2,), "steps": 200}}`` (smaller fits for tests);
            ``{"auto": {"families": (...)}}`` limits ``auto``'s candidates.
        personas: the study's persona dictionary ``mu [K, I, O]`` (``auto``'s
            ``persona_mixture`` and ``mixed`` candidates; skipped without one).
        progress: called with the fraction done in ``[0, 1]`` and a message: after each EM
            restart of the latent classes (``"K grid: 8 classes (2 of 4), restart 1 of
            2"``), and before each CAPE fit (``"auto: fitting cape_linear (3 of 4)"``).
            Does not change the fit.

    Returns:
        the fitted model; for ``auto`` its ``metrics["model_choice"]`` is the comparison
        table (validation target log loss of each candidate and of the mixture).

    Raises:
        ElicitationError: unknown ``kind``; ``auto`` without target or question items.
    """
    train = torch.as_tensor(train, dtype=torch.long)
    val_t = None if val is None or val.shape[0] == 0 else torch.as_tensor(val, dtype=torch.long)
    lc = dict(latent_class_options or {})
    opts = {k: dict(v) for k, v in (fit_options or {}).items()}
    if kind == "default":
        return fit_latent_classes(
            train, item_bank, val_responses=val_t, seed=seed, progress=progress, **lc
        )
    if kind in CAPE_FAMILIES:
        if progress is not None:
            progress(0.0, f"fitting {kind}")
        kw = opts.get(kind, {})
        if kind == "cape_cooccurrence":
            return CapeCooccurrence.fit(train, item_bank, validation=val_t, seed=seed, **kw)
        if kind == "cape_linear":
            return CapeLinear.fit(train, item_bank, validation=val_t, seed=seed, **kw)
        return CapeFactor.fit(train, item_bank, validation=val_t, seed=seed, progress=False, **kw)
    if kind != "auto":
        raise ElicitationError(
            f"belief model {kind!r} cannot be fitted here (known: {', '.join(BELIEF_MODEL_CHOICES)})"
        )
    if not targets:
        raise ElicitationError("auto needs at least one target item to compare models on")
    if not candidates:
        raise ElicitationError("auto needs at least one question item to ask")
    unscored = None
    if val_t is None:
        if train.shape[0] < AUTO_MIN_UNSPLIT:
            unscored = (
                f"{train.shape[0]} respondents and none set aside for validation "
                f"(at least {AUTO_MIN_UNSPLIT} are split): nothing to compare on"
            )
            val_t = train[:0]
        else:
            held, kept = split_rows(train.shape[0], 0.2, seed)
            train, val_t = train[kept], train[held]
    ctx = FitContext(
        item_bank,
        train,
        val_t,
        [int(i) for i in demographics],
        [int(i) for i in candidates],
        [int(i) for i in targets],
        seed=seed,
        base_seed=seed,
        options={
            **opts,
            "latent_classes": lc,
            **({"personas": {"mu": personas}} if personas is not None else {}),
        },
    )
    with fits_scope():  # a long-running worker keeps no fits of past studies
        if unscored is not None:
            return _unscored_choice(ctx, ["latent_classes"], {}, [], unscored)
        return _fit_auto(ctx, progress)


def _eig(ctx: FitContext) -> Any:
    return get_criterion("eig")


for _name, _fit, _desc in (
    (
        "cape_cooccurrence",
        CAPE_FITS["cape_cooccurrence"],
        "CAPE co-occurrence world model (naive Bayes / item CF hybrid) + EIG on the targets",
    ),
    (
        "cape_linear",
        CAPE_FITS["cape_linear"],
        "CAPE linear-Gaussian factor model (exact conditioning, calibrated) + EIG",
    ),
    (
        "cape_factor",
        CAPE_FITS["cape_factor"],
        "CAPE Pyro latent factor model (importance-sampled posterior) + EIG",
    ),
    (
        "auto",
        fit_auto,
        "best single family (latent classes, CAPE models, personas, mixed) on validation "
        "target log loss, or their stack when it is better by more than its SE + EIG",
    ),
):
    register_method(Method(_name, _fit, _eig, _desc))


def fitted_models() -> list[tuple[tuple[Any, ...], BeliefModel]]:
    """The fits kept in this process's memo, ``(key, model)`` (``key[0]`` the family)."""
    return list(_MEMO.items())


__all__ = [
    "AUTO_CANDIDATES",
    "FAMILIES",
    "Family",
    "register_family",
    "fits_scope",
    "stack_beats_single",
    "user_log_loss",
    "BELIEF_MODEL_CHOICES",
    "fit_belief_model",
    "stack_models",
    "ModelChoice",
    "choose_model",
    "fit_auto",
    "fitted_models",
]
