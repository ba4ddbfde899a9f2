"""Simulation before fielding: "how many questions do I need?".

Replays the study's historical (imported) respondents through the adaptive loop with the
benchmark harness (:func:`elicitation.bench.individual.simulate`, the methods of
:mod:`elicitation.bench.methods`, the metrics of :mod:`elicitation.bench.metrics`), for the
study's own design rather than a dataset's benchmark runs:

* **items**: attribute items are observed for free; the study's ``question`` items are the
  candidates; its ``target`` items are predicted and scored (they are never asked);
* **users**: the imported respondents' split (``train`` fits the models, ``val`` chooses
  the number of latent classes, ``test`` is replayed and scored). A study imported
  without a split gets a seeded 70/10/20 split of its respondents. Live respondents who
  answered every question item (a pilot asked everything, say) are as complete as an
  import and take part like imported ones (seeded split); other live respondents answered
  only what the adaptive loop asked, which would bias a replay, so they are training
  data only (:func:`simulation_respondents`);
* **model**: the study's chosen belief model (its ``belief_model`` setting: latent
  classes, a CAPE family, ``auto``'s model choice of
  :func:`elicitation.model_choice.fit_auto`, or the persona prior over the study's stored
  persona distributions), fitted on the ``train`` users as the fit job would
  (:func:`study_model_fit`); every method below uses it (a study whose criterion is
  ``irt`` keeps the graded response model that criterion needs);
* **methods**: the study's selection criterion and the baselines ``random`` (a random
  order), ``fixed`` (one non-adaptive order) and ``full`` (every candidate answered: the
  ceiling);
* **curves**: accuracy and log loss on the targets after ``n = 0 .. budget`` questions,
  averaged over all (test respondent, target) pairs with a known answer.

The answer to "how many questions do I need" is :func:`questions_needed`: the first ``n``
at which the study's criterion closes ``share`` (default 90 %) of the accuracy gap between
asking nothing (``n = 0``) and asking everything (``full``).

Deterministic: every fit and criterion is seeded from ``seed``; test users are replayed in
fixed chunks (progress is reported per chunk), so a retried job gives the same result.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from sqlmodel import Session, select

from app.errors import ConflictError, InvalidInputError
from app.schemas import StudySettings
from app.services import learning
from app.services.belief import persona_prior_model
from app.services.designer import study_items
from app.tables import Item, ItemRole, Respondent, RespondentSource, Study
from elicitation import model_choice
from elicitation.bench.individual import simulate
from elicitation.bench.methods import (
    FitContext,
    FitFn,
    Method,
    fit_irt_model,
    fit_latent_class_model,
    fit_persona_em,
    get_method,
    method_names,
)
from elicitation.bench.metrics import score_predictions
from elicitation.criteria import get_criterion
from elicitation.errors import ElicitationError
from models.base import MISSING, BeliefModel, ItemBank

BASELINES: tuple[str, ...] = ("random", "fixed", "full")
DEFAULT_N_CLASSES: tuple[int, ...] = (8, 16)
CHUNK = 256
ProgressFn = Callable[[float, str], None]


@dataclass(frozen=True)
class SimulationOptions:
    """Options of one simulation (the job's payload).

    Attributes:
        budget: most questions per respondent (default: the study's ``max_questions``,
            at most the number of candidates).
        max_test_users: replay at most this many test respondents (the first by id).
        n_classes: latent-class numbers tried (chosen on validation users).
        seed: seed of the fits, criteria and the split of a study without one.
        baselines: the baseline methods compared with the study's criterion (a subset of
            :data:`BASELINES`).
    """

    budget: int | None = None
    max_test_users: int = 1000
    n_classes: tuple[int, ...] = DEFAULT_N_CLASSES
    seed: int = 0
    baselines: tuple[str, ...] = BASELINES

    def __post_init__(self) -> None:
        unknown = sorted(set(self.baselines) - set(BASELINES))
        if unknown:
            raise InvalidInputError(f"unknown baselines {unknown} (known: {', '.join(BASELINES)})")
        if "full" not in self.baselines:
            raise InvalidInputError("the 'full' baseline (the ceiling) is always needed")
        if self.max_test_users < 1:
            raise InvalidInputError("max_test_users must be >= 1")
        if self.budget is not None and self.budget < 0:
            raise InvalidInputError(f"budget must be >= 0, got {self.budget}")
        if not self.n_classes or min(self.n_classes) < 1:
            raise InvalidInputError("n_classes must be positive integers")

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> SimulationOptions:
        try:
            budget = payload.get("budget")
            return cls(
                budget=None if budget in (None, "") else int(budget),
                max_test_users=int(payload.get("max_test_users", 1000)),
                n_classes=tuple(int(k) for k in payload.get("n_classes", DEFAULT_N_CLASSES)),
                seed=int(payload.get("seed", 0)),
                baselines=tuple(str(b) for b in payload.get("baselines", BASELINES)),
            )
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"invalid simulation options: {exc}") from None


def _split_of(rid: int, seed: int) -> str:
    h = int(hashlib.sha256(f"{seed}:{rid}".encode()).hexdigest()[:8], 16) % 10
    return "train" if h < 7 else ("val" if h < 8 else "test")


def _study_method(criterion: str) -> tuple[str, Any]:
    """The benchmark method name and factory for the study's criterion.

    A criterion that is a benchmark method of the same name (``eig_anchored``, the default,
    which is also the benchmark's ``default``; ``eig``; ``eig_tempered``; ``eig2``) uses
    that method, so the simulation selects exactly as the benchmark measured; others get
    a method built from the registry with the criterion's defaults.
    """
    if criterion in method_names() and criterion not in BASELINES:
        return f"{criterion} (study)", get_method(criterion)
    fit = fit_irt_model if criterion == "irt" else fit_latent_class_model

    def make(ctx: Any) -> Any:
        return get_criterion(criterion)

    return f"{criterion} (study)", Method(
        criterion, fit, make, f"the study's criterion {criterion}"
    )


def study_model_fit(kind: str, persona_mu: torch.Tensor | None) -> FitFn:
    """The fit of the study's ``belief_model`` setting on a simulation's
    :class:`~elicitation.bench.methods.FitContext` (training users; validation users
    choose hyper-parameters and, for ``auto``, the model).

    ``persona_mu`` is the study's persona dictionary ``[K, I, O]`` (``None`` without
    stored distributions): ``persona_mixture`` uses it with its prior fitted by EM on the
    training users (a single uniform persona without one); ``auto`` offers it to its
    persona candidates.
    """
    if kind == "default":
        return fit_latent_class_model
    if kind in model_choice.CAPE_FAMILIES:
        return model_choice.FAMILIES[kind].fit
    if kind == "persona_mixture":

        def fit_personas(ctx: FitContext) -> BeliefModel:
            if persona_mu is None:
                mask = ctx.item_bank.option_mask().to(torch.float64)
                return fit_persona_em(ctx, (mask / mask.sum(-1, keepdim=True)).unsqueeze(0))
            return fit_persona_em(ctx, persona_mu)

        return fit_personas
    if kind == "auto":

        def fit_auto(ctx: FitContext) -> BeliefModel:
            if ctx.val.shape[0] == 0:
                raise InvalidInputError(
                    "belief_model auto needs validation respondents to choose a model: "
                    "import some with split 'val' (or none with a split, for a seeded one)"
                )
            try:
                return model_choice.fit_auto(ctx)
            except ElicitationError as exc:
                raise InvalidInputError(f"belief_model auto: {exc}") from None

        return fit_auto
    raise InvalidInputError(
        f"belief_model: unknown {kind!r} (known: {', '.join(model_choice.BELIEF_MODEL_CHOICES)})"
    )


def questions_needed(
    curve: Sequence[float], start: float, ceiling: float, share: float
) -> int | None:
    """First ``n`` with ``curve[n] - start >= share * (ceiling - start)``; ``None`` if never.

    When asking cannot help (``ceiling <= start``), ``0``.
    """
    gap = ceiling - start
    if gap <= 0:
        return 0
    for n, value in enumerate(curve):
        if value is not None and value - start >= share * gap - 1e-12:
            return n
    return None


def _item_roles(items: Sequence[Item]) -> tuple[list[int], list[int], list[int]]:
    """Column indices ``(attrs, cand, tgt)`` of the attribute, question and target items.

    Raises:
        InvalidInputError: no target item, or no question item.
    """
    attrs = [j for j, it in enumerate(items) if it.role == ItemRole.attribute.value]
    cand = [j for j, it in enumerate(items) if it.role == ItemRole.question.value]
    tgt = [j for j, it in enumerate(items) if it.role == ItemRole.target.value]
    if not tgt:
        raise InvalidInputError("choose at least one target item before simulating")
    if not cand:
        raise InvalidInputError("the study has no question items to ask")
    return attrs, cand, tgt


def simulation_respondents(
    study_id: int, items: Sequence[Item], *, session: Session
) -> tuple[list[tuple[int, list[int], str | None]], list[list[int]]]:
    """The respondents a simulation replays, and those it only fits on.

    Returns ``(replayable, fit_only)``: ``replayable`` holds ``(respondent id, row,
    split)`` of every imported respondent (its dataset split, ``None`` without one) and of
    every live respondent who answered every question item (split ``"live"``); ``fit_only`` the
    rows of the other live respondents with some answer. Row ``j`` is the option index of
    ``items[j]`` (attributes included), ``MISSING`` where unanswered or unknown; both in
    respondent id order.

    Example: questions ``a, b`` and a target ``t``; a live respondent with ``a = A, b = B``
    is replayable, one with only ``a = A, t = A`` (asked ``a``, then ``t`` as calibration)
    is fit only.
    """
    questions = [j for j, it in enumerate(items) if it.role == ItemRole.question.value]
    replayable = learning.imported_rows(study_id, items, session=session)
    fit_only: list[list[int]] = []
    for rid, row in learning.live_rows(study_id, items, session=session).items():
        if questions and all(row[j] >= 0 for j in questions):
            replayable.append((rid, row, "live"))
        elif any(v >= 0 for v in row):
            fit_only.append(row)
    return replayable, fit_only


def _respondent_parts(
    study_id: int, items: Sequence[Item], seed: int, *, session: Session
) -> tuple[dict[str, torch.Tensor], bool]:
    """The respondents of :func:`simulation_respondents` as ``{"train", "val", "test":
    LongTensor [n, I]}`` (rows as there; the fit-only ones in ``train``).

    The second value says whether the imported respondents have their own split (one
    without a split then trains); a replayable live respondent, and every respondent of a
    study imported without a split, goes to ``train``, ``val`` or ``test`` by
    :func:`_split_of`.
    """
    replayable, fit_only = simulation_respondents(study_id, items, session=session)
    parts: dict[str, list[list[int]]] = {"train": [], "val": [], "test": []}
    any_split = any(split not in (None, "live") for _, _, split in replayable)
    for rid, row, split in replayable:
        live = split == "live"
        where = (split or "train") if any_split and not live else _split_of(rid, seed)
        parts[where].append(row)
    parts["train"].extend(fit_only)
    n = len(items)
    tensors = {k: torch.tensor(r, dtype=torch.long).reshape(-1, n) for k, r in parts.items()}
    return tensors, any_split


MIN_REPLAYABLE = 11
"""Replayable respondents (:func:`simulation_respondents`) a simulation needs at the least:
10 to fit on and 1 to replay."""


def imported_count(study: Study, *, session: Session, limit: int = MIN_REPLAYABLE) -> int:
    """The study's imported respondents, counted up to ``limit``."""
    return len(
        session.exec(
            select(Respondent.id)
            .where(
                Respondent.study_id == study.id,
                Respondent.source == RespondentSource.import_.value,
            )
            .limit(limit)
        ).all()
    )


def unavailable_reason(study: Study, *, session: Session) -> str | None:
    """Why a simulation of ``study`` would fail now, shown before the researcher starts
    one (the Run button is disabled with it, and :func:`check_can_start` refuses the
    job); ``None`` when it can run. In order: fewer than :data:`MIN_REPLAYABLE` imported
    respondents and live ones who answered every question; no target or no question item;
    no respondent with an answer to a target item, or test respondents (of the split the
    job makes with its default seed) none of whom has one: nothing to score."""
    items = study_items(study, session=session)
    n_imported = imported_count(study, session=session)
    if n_imported < MIN_REPLAYABLE:
        replayable, _ = simulation_respondents(study.id or 0, items, session=session)
        n = len(replayable)
        if n < MIN_REPLAYABLE:
            return _too_few_words(n_imported, n - n_imported)
    try:
        _, _, tgt = _item_roles(items)
    except InvalidInputError as exc:
        return f"{str(exc)[0].upper()}{str(exc)[1:]} (Design page, Items)."
    parts, _ = _respondent_parts(study.id or 0, items, SimulationOptions().seed, session=session)
    test = parts["test"]
    anyone = any(bool((p[:, tgt] >= 0).any()) for p in parts.values())
    if anyone and (test.shape[0] == 0 or bool((test[:, tgt] >= 0).any())):
        return None
    keys = ", ".join(items[j].key for j in tgt)
    scoring = (
        "a simulation scores its predictions of the targets against the respondents' own "
        "answers, so there is nothing to score"
    )
    if not anyone:
        return (
            f"No respondent of this study has an answer to a target item ({keys}): "
            f"{scoring}. Choose as targets items the imported respondents answered "
            "(Design page, Items), or import a dataset with answers to them."
        )
    n_test = int(test.shape[0])
    return (
        f"None of the {n_test} test respondent{'' if n_test == 1 else 's'} a simulation "
        f"would score has an answer to a target item ({keys}): {scoring}. Those who "
        "answered a target are all in the training part of the dataset's split: import a "
        "dataset whose test respondents answered the targets."
    )


def _too_few_words(n_imported: int, n_live: int) -> str:
    return (
        f"This study has {n_imported} imported respondent{'' if n_imported == 1 else 's'} and "
        f"{n_live} live respondent{'' if n_live == 1 else 's'} who answered every question; "
        "a simulation replays complete answers (other live respondents answered only what "
        f"they were asked) and needs at least {MIN_REPLAYABLE}. Import a dataset with this "
        "study's items (Import), or field a pilot that asks every question (questions per "
        "respondent at least the number of question items), to simulate; meanwhile the "
        "model versions on the study page show how the model learns from live respondents."
    )


def check_can_start(study: Study, payload: dict[str, Any], *, session: Session) -> None:
    """Refuse a simulation job before it is queued: bad options
    (:class:`InvalidInputError`, 422) or a study it would fail on
    (:func:`unavailable_reason`; :class:`ConflictError`, 409)."""
    SimulationOptions.from_payload(payload)
    reason = unavailable_reason(study, session=session)
    if reason is not None:
        raise ConflictError(f"simulation not started: {reason}")


FEW_TEST_RESPONDENTS = 30
"""Below this many test respondents a simulation's result carries a caution instead of a
conclusion: one respondent then moves a target's accuracy by more than 1/30 = 0.033, about
the whole gain of asking on CES (0.797 with no question, 0.843 after 10)."""


def _test_users(
    train: torch.Tensor, test: torch.Tensor, tgt: list[int], max_test_users: int
) -> torch.Tensor:
    """The first ``max_test_users`` test rows with an answer to some target item.

    Raises:
        InvalidInputError: fewer than 10 training or no test respondents, or no test
            respondent with a target answer.
    """
    if train.shape[0] < 10 or test.shape[0] < 1:
        raise InvalidInputError(
            f"the study has too few respondents to simulate "
            f"({train.shape[0]} training, {test.shape[0]} test; need >= 10 and >= 1): a "
            "simulation replays imported respondents and live ones who answered every "
            "question (other live respondents answered only what they were asked); import "
            "a dataset (Import) or field a pilot that asks every question to simulate"
        )
    test = test[(test[:, tgt] >= 0).any(1)][:max_test_users]
    if test.shape[0] == 0:
        raise InvalidInputError("no test respondent has an answer to any target item")
    return test


def _fit_context(
    bank: ItemBank,
    train: torch.Tensor,
    val: torch.Tensor,
    roles: tuple[list[int], list[int], list[int]],
    persona_mu: torch.Tensor | None,
    opts: SimulationOptions,
) -> FitContext:
    """The :class:`FitContext` of the simulation's fits, seeded from ``opts.seed``.

    ``roles`` is ``(attrs, cand, tgt)``. Latent classes try ``opts.n_classes``; with a
    persona prior (``persona_mu`` ``[P, I, O]``) the ``personas`` fit gets it as ``mu``.
    """
    attrs, cand, tgt = roles
    fit_options: dict[str, dict[str, Any]] = {
        "latent_classes": {"n_classes": tuple(opts.n_classes)}
    }
    if persona_mu is not None:
        fit_options["personas"] = {"mu": persona_mu}
    return FitContext(
        bank,
        train,
        val,
        attrs,
        cand,
        tgt,
        seed=opts.seed,
        base_seed=opts.seed,
        cache={},
        options=fit_options,
    )


def _replay_inputs(
    test: torch.Tensor,
    n: int,
    roles: tuple[list[int], list[int], list[int]],
    n_opt: torch.Tensor,
) -> dict[str, Any]:
    """What :func:`_score_method` replays for the ``U`` test users ``test`` ``[U, n]``.

    ``observed`` ``[U, n]`` (the attributes, ``MISSING`` elsewhere), ``answers``
    ``[U, C]`` (the candidates), ``truth`` ``[U, T]`` (the targets), ``chunks`` (slices of
    at most ``CHUNK`` users), ``cand``, ``tgt`` and ``n_opt`` ``[n]``; ``roles`` is
    ``(attrs, cand, tgt)``.
    """
    attrs, cand, tgt = roles
    observed = torch.full((test.shape[0], n), MISSING, dtype=torch.long)
    observed[:, attrs] = test[:, attrs]
    chunks = [slice(i, min(i + CHUNK, test.shape[0])) for i in range(0, test.shape[0], CHUNK)]
    return {
        "observed": observed,
        "answers": test[:, cand],
        "truth": test[:, tgt],
        "chunks": chunks,
        "cand": cand,
        "tgt": tgt,
        "n_opt": n_opt,
    }


def _score_method(
    name: str,
    method: Method,
    model: BeliefModel,
    ctx: FitContext,
    replay: dict[str, Any],
    budget: int,
    report: ProgressFn,
    done: int,
    steps: int,
) -> tuple[dict[str, Any], int]:
    """Replay the test users chunk by chunk with one method; its curves and the new ``done``.

    ``replay`` holds ``observed`` (``[U, I]``, attributes only), ``answers`` (``[U, C]``),
    ``truth`` (``[U, T]``), ``chunks``, ``cand``, ``tgt`` and ``n_opt``. Returns
    ``{"accuracy", "log_loss": [budget + 1] (None where not finite), "description"}``, the
    mean over (test user, target) pairs after ``0 .. budget`` questions; progress is
    reported before each chunk at ``done / steps``, and ``done`` grows by one per chunk.
    """
    observed, answers, truth = replay["observed"], replay["answers"], replay["truth"]
    cand, tgt, n_opt = replay["cand"], replay["tgt"], replay["n_opt"]
    sums: list[Any] = [None] * (budget + 1)
    crit: Any = None
    for part in replay["chunks"]:
        report(done / steps, f"{name}: respondents {part.start + 1}-{part.stop}")
        if method.observe_all:
            obs = observed[part].clone()
            obs[:, cand] = answers[part]
            full_pred = model.predict_batch(model.initial_batch(obs), tgt)
            preds = [full_pred] * (budget + 1)
        else:
            assert method.criterion is not None
            if crit is None or not crit.uses_fixed_order:
                # an order-based criterion keeps its fixed order for every chunk
                # (searched once); others are built per chunk
                crit = method.criterion(ctx)
            preds, _ = simulate(model, crit, observed[part], cand, answers[part], tgt, budget)
        for k, pred in enumerate(preds):
            scored = score_predictions(pred, truth[part], n_opt[tgt])
            sums[k] = scored if sums[k] is None else sums[k].add(scored)
        done += 1
    means = [m.means() for m in sums]
    result = {
        "accuracy": [_finite(m["accuracy"]) for m in means],
        "log_loss": [_finite(m["log_loss"]) for m in means],
        "description": method.description,
    }
    return result, done


def run_study_simulation(
    study: Study,
    *,
    session: Session,
    options: SimulationOptions | None = None,
    progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """Simulate the study's design on its historical respondents (see the module doc).

    Returns:
        ``{"budget", "criterion", "belief_model", "model_family" (of the study method's
        model), "targets", "candidates", "n_train", "n_val", "n_test",
        "methods": {name: {"accuracy": [budget+1], "log_loss": [...], "description"}},
        "study_method", "questions_needed": {"90%": n or None, "95%": ...}, "seconds"}``.

    Raises:
        InvalidInputError: no target or candidate items, too few historical respondents,
            or a bad budget.
    """
    opts = options or SimulationOptions()
    report = progress or (lambda f, m: None)
    started = time.perf_counter()
    assert study.id is not None
    items = study_items(study, session=session)
    attrs, cand, tgt = _item_roles(items)
    settings = StudySettings.model_validate(study.settings or {})
    budget = settings.budgets.max_questions if opts.budget is None else opts.budget
    if budget < 0:
        raise InvalidInputError(f"budget must be >= 0, got {budget}")
    budget = min(budget, len(cand))

    parts, any_split = _respondent_parts(study.id, items, opts.seed, session=session)
    n = len(items)
    train, val = parts["train"], parts["val"]
    test = _test_users(train, parts["test"], tgt, opts.max_test_users)

    bank = ItemBank(tuple(it.key for it in items), tuple(len(it.options) for it in items))
    n_opt = torch.tensor(bank.n_options, dtype=torch.long)
    prior = persona_prior_model(study, items, session=session)
    persona_mu = prior.mu if prior.metrics.get("prior") == "persona" else None
    ctx = _fit_context(bank, train, val, (attrs, cand, tgt), persona_mu, opts)
    study_fit = study_model_fit(settings.belief_model, persona_mu)
    study_name, study_method = _study_method(settings.criterion)
    methods = [(study_name, study_method)] + [(b, get_method(b)) for b in opts.baselines]
    methods = [  # every method asks with the study's model (irt needs its own)
        (name, m if m.fit is fit_irt_model else dataclasses.replace(m, fit=study_fit))
        for name, m in methods
    ]
    families: dict[str, str] = {}
    replay = _replay_inputs(test, n, (attrs, cand, tgt), n_opt)
    chunks = replay["chunks"]
    steps = len(methods) * (len(chunks) + 1)
    done = 0
    out: dict[str, Any] = {}
    old_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # deterministic sums; the machine is shared
    with model_choice.fits_scope():  # a worker keeps no fits of past studies
        try:
            for name, method in methods:
                report(done / steps, f"fitting the model for {name}")
                model = method.fit(ctx)
                families[name] = model.family
                done += 1
                out[name], done = _score_method(
                    name, method, model, ctx, replay, budget, report, done, steps
                )
        finally:
            torch.set_num_threads(old_threads)
    acc = out[study_name]["accuracy"]
    ceiling = out["full"]["accuracy"][0]
    needed = {
        f"{int(share * 100)}%": questions_needed(acc, acc[0], ceiling, share)
        for share in (0.8, 0.9, 0.95)
    }
    report(1.0, "done")
    return {
        "budget": budget,
        "criterion": settings.criterion,
        "study_method": study_name,
        "belief_model": settings.belief_model,
        "model_family": families[study_name],
        "targets": [items[j].key for j in tgt],
        "candidates": [items[j].key for j in cand],
        "n_train": int(train.shape[0]),
        "n_val": int(val.shape[0]),
        "n_test": int(test.shape[0]),
        "split": "study" if any_split else f"seeded 70/10/20 (seed {opts.seed})",
        "methods": out,
        "questions_needed": needed,
        "seconds": round(time.perf_counter() - started, 2),
    }


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None
