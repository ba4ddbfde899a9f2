"""The lifecycle benchmark: a study learning from its own live respondents, replayed.

``priorly bench lifecycle`` measures what the learning loop (:mod:`app.services.learning`)
buys a study that starts with no history. For each benchmark run of the dataset
(``runs.csv``: a seed, candidate items, target items; the first ``runs`` of them):

1. **The study.** A fresh SQLite database (``alembic upgrade head``) in a temporary
   folder; the dataset imported by the product's importer without its respondents
   (:func:`app.services.importer.import_dataset` with ``respondents=False``); its items
   cut to the run's (the demographics as ``attribute``, the run's candidates as
   ``question``, its targets as ``target``); settings: the product's defaults
   (criterion ``eig_anchored``, ``belief_model`` ``default``) with
   ``budgets.max_questions`` = ``live_questions``, ``calibration_items`` and
   ``calibration_min_answers`` as given (by default a new study's) and ``refit_every = 0``
   (the refits happen at the checkpoints, below); published.
2. **The cold start.** :func:`app.services.belief.fit_study_model` on the study without
   history: the persona prior, which is one uniform persona because the benchmark's
   study has no persona distributions (the first model of a study is promoted).
3. **Arrivals.** The dataset's training and validation users, in an order shuffled by the
   run's seed, arrive one by one as live respondents through the product's session code
   (:func:`app.session.start_session` with their demographics as known attributes and
   their dataset id as ``external_id``, then
   :func:`app.session.submit_answer` for every question the product asks: the user's
   recorded answer, or a skip when the data has none), until the session completes.
4. **Checkpoints.** When the number of arrivals reaches a value of ``arrivals``, the
   product's refit runs (:func:`app.services.belief.fit_study_model`, the function of the
   ``fit_model`` job and of "Refit now": its own split of the live respondents into
   training, selection and held-out parts, promotion only when the new fit beats the
   active model on the held-out ones). Then the test users are scored with the study's
   active model (:func:`app.session.load_runtime`, as a new session would get it).

**Scoring** follows ``bench individual`` (:mod:`elicitation.bench.individual`): the same
test users (those with a recorded answer to a target of the run) and targets;
demographics observed for free; after ``n = 0..budget`` questions asked among the run's
candidates the user answered, accuracy and log loss over all (test user, target) pairs
with a known answer (:func:`elicitation.bench.metrics.score_predictions`).

**Methods.** ``default``: the active model with the study runtime's criterion
(``eig_anchored`` with the stored fixed order). ``fixed``: the same active model asking
its non-adaptive fixed order (the anchor of ``eig_anchored``). ``uniform``: a single
uniform persona, never refitted (``eig``; its predictions are uniform whatever it asks).
``full_history``: ``bench individual``'s ``default`` (latent classes fitted on all the
training users, classes chosen on the validation users); it does not depend on the
arrivals, so its one curve is repeated at every arrival count.
"""

from __future__ import annotations

import math
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from sqlalchemy import delete
from sqlmodel import Session, col, select

from app.db import make_engine, upgrade
from app.errors import InvalidInputError
from app.schemas import DEFAULT_CALIBRATION_ITEMS, DEFAULT_CALIBRATION_MIN_ANSWERS
from app.services import belief
from app.services.importer import import_dataset
from app.services.learning import model_versions
from app.session import clear_runtime_cache, load_runtime, start_session, submit_answer
from app.tables import ElicitationSession, Item, ItemRole, Study, StudyStatus
from elicitation.bench.individual import run_individual, simulate
from elicitation.bench.metrics import score_predictions
from elicitation.criteria import get_criterion
from elicitation.datasets import BenchmarkRun, Dataset, load_dataset
from models.base import MISSING
from models.persona import PersonaMixture

METHODS: tuple[str, ...] = ("default", "uniform", "fixed", "full_history")
"""The methods of the lifecycle benchmark, in the JSON's order."""
CURVES: tuple[str, ...] = ("accuracy", "log_loss")
"""The metrics each method reports after ``0..budget`` questions."""


def parse_arrivals(text: str) -> list[int]:
    """``"0,50,200"`` -> ``[0, 50, 200]``: distinct integers >= 0, increasing.

    Raises:
        InvalidInputError: an empty list, a non-integer, a negative or a repeated value,
            or values out of order.
    """
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise InvalidInputError(f"--arrivals: expected comma-separated counts, got {text!r}")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise InvalidInputError(f"--arrivals: not an integer list: {text!r}") from None
    if any(v < 0 for v in values):
        raise InvalidInputError(f"--arrivals: counts must be >= 0, got {text!r}")
    if any(b <= a for a, b in zip(values, values[1:], strict=False)):
        raise InvalidInputError(f"--arrivals: counts must increase, got {text!r}")
    return values


def _check(
    ds: Dataset, arrivals: Sequence[int], budget: int, n_runs: int, live_questions: int,
    calibration_items: int, calibration_min_answers: int,
) -> list[str]:  # fmt: skip
    """The arriving users (train + val ids); raises :class:`InvalidInputError` on bad input."""
    if budget < 0:
        raise InvalidInputError(f"--budget must be >= 0, got {budget}")
    if ds.split is None or not ds.split.get("test_users") or not ds.split.get("train_users"):
        raise InvalidInputError(f"dataset {ds.name!r} needs train and test users (user_split.json)")
    if not ds.runs:
        raise InvalidInputError(f"dataset {ds.name!r} has no benchmark runs (runs.csv)")
    if n_runs < 1 or n_runs > len(ds.runs):
        raise InvalidInputError(f"--runs must be between 1 and {len(ds.runs)}, got {n_runs}")
    if not arrivals:
        raise InvalidInputError("--arrivals: no arrival counts given")
    if live_questions < 1:
        raise InvalidInputError(f"--live-questions must be >= 1, got {live_questions}")
    if calibration_items < 0 or calibration_items >= live_questions:
        raise InvalidInputError(
            f"--calibration-items must be between 0 and {live_questions - 1} "
            f"(below --live-questions), got {calibration_items}"
        )
    if calibration_min_answers < 0:
        raise InvalidInputError(
            f"--calibration-min-answers must be >= 0, got {calibration_min_answers}"
        )
    users = [*ds.split["train_users"], *ds.split.get("val_users", [])]
    if arrivals[-1] > len(users):
        raise InvalidInputError(
            f"--arrivals: {arrivals[-1]} arrivals but dataset {ds.name!r} has only "
            f"{len(users)} training and validation users"
        )
    return users


def _study_for_run(
    ds: Dataset, path: Path, run: BenchmarkRun, db: Session, live_questions: int,
    calibration_items: int, calibration_min_answers: int,
) -> Study:  # fmt: skip
    """Import the dataset's items (no respondents) and shape them to the run's roles."""
    result = import_dataset(path, session=db, respondents=False)
    attributes = set(ds.demographics)
    cand, tgt = set(run.cand_qids), set(run.eval_qids)
    keep = attributes | cand | tgt
    db.exec(  # type: ignore[call-overload]
        delete(Item).where(col(Item.study_id) == result.study_id, col(Item.key).not_in(keep))
    )
    for item in db.exec(select(Item).where(Item.study_id == result.study_id)).all():
        item.role = (
            ItemRole.attribute.value
            if item.key in attributes
            else ItemRole.target.value
            if item.key in tgt
            else ItemRole.question.value
        )
        db.add(item)
    study = db.exec(select(Study).where(Study.id == result.study_id)).one()
    settings = dict(study.settings)
    settings["budgets"] = {**settings["budgets"], "max_questions": live_questions}
    settings["calibration_items"] = calibration_items
    settings["calibration_min_answers"] = calibration_min_answers
    settings["refit_every"] = 0
    study.settings = settings
    study.status = StudyStatus.published.value
    db.add(study)
    db.commit()
    db.refresh(study)
    return study


def _arrive(study: Study, engine: Any, ds: Dataset, user: str, keys: list[str]) -> int:
    """One user takes a live session, answering what the product asks from the data
    (a skip where the user has no recorded answer). Returns the number of questions."""
    row = ds.matrix(keys=keys, users=[user])[0]
    letters = {k: ds.item(k).letters for k in keys}
    known = {k: letters[k][int(v)] for k, v in zip(keys, row, strict=True) if v >= 0}
    attrs = {k: known[k] for k in ds.demographics if k in known}
    started = start_session(study, engine=engine, attributes=attrs, external_id=user)
    view, n = started.view, 0
    while view.question is not None:
        key = view.question.key
        view = submit_answer(
            study, started.session_id, item_key=key, option=known.get(key), idempotency_key=None,
            engine=engine,
        )  # fmt: skip
        n += 1
    return n


def _uniform_model(bank: Any) -> PersonaMixture:
    """One persona, uniform over every item's options."""
    mask = bank.option_mask().to(torch.float64)
    return PersonaMixture(bank, (mask / mask.sum(-1, keepdim=True)).unsqueeze(0))


def _score(
    model: Any, criterion: Any, test: torch.Tensor, demo: list[int], cand: list[int],
    tgt: list[int], budget: int,
) -> dict[str, list[float]]:  # fmt: skip
    """``bench individual``'s scoring of the test users ``test [U, I]`` (model item order):
    ``{"accuracy": [budget + 1], "log_loss": [budget + 1]}``."""
    truth = test[:, tgt]
    users = (truth >= 0).any(1)
    observed = torch.full((int(users.sum()), test.shape[1]), MISSING, dtype=torch.long)
    observed[:, demo] = test[users][:, demo]
    answers, truth = test[users][:, cand], truth[users]
    n_opt = torch.tensor(model.item_bank.n_options, dtype=torch.long)[tgt]
    preds, _ = simulate(model, criterion, observed, cand, answers, tgt, budget)
    out: dict[str, list[float]] = {m: [] for m in CURVES}
    for p in preds:
        means = score_predictions(p, truth, n_opt).means()
        for m in CURVES:
            out[m].append(float(means[m]))
    return out


def _lifecycle_run(
    ds: Dataset, path: Path, run: BenchmarkRun, users: list[str], arrivals: Sequence[int],
    budget: int, live_questions: int, calibration_items: int, calibration_min_answers: int,
    folder: Path, log: Callable[[str], None],
) -> dict[str, Any]:  # fmt: skip
    """One run: ``{"default"|"uniform"|"fixed": {curve: [[budget + 1] per arrival]},
    "versions": [...], "n_sessions", "n_questions", "seconds"}``."""
    started_at = time.perf_counter()
    url = f"sqlite:///{folder / f'lifecycle-{run.seed}.db'}"
    upgrade(url)
    engine = make_engine(url)
    clear_runtime_cache()
    belief.clear_model_cache()
    curves: dict[str, dict[str, list[list[float]]]] = {
        m: {c: [] for c in CURVES} for m in ("default", "uniform", "fixed")
    }
    checkpoints: list[dict[str, Any]] = []
    order = list(users)
    random.Random(run.seed).shuffle(order)
    n_questions = 0
    with Session(engine) as db:
        study = _study_for_run(
            ds, path, run, db, live_questions, calibration_items, calibration_min_answers
        )
        belief.fit_study_model(study, session=db)  # the cold start
        done = 0
        for target in arrivals:
            keys = [it.key for it in db.exec(select(Item).where(Item.study_id == study.id)).all()]
            while done < target:
                n_questions += _arrive(study, engine, ds, order[done], keys)
                done += 1
            if target > 0:
                row = belief.fit_study_model(study, session=db)
                log(f"run {run.seed}: {target} arrivals, refit {row.status} ({row.reason})")
            db.refresh(study)
            clear_runtime_cache()
            rt = load_runtime(study, engine=engine, fit_if_missing=False)
            model = rt.model
            index = rt.model_index
            cand = [index[c.id] for c in rt.candidates]
            tgt = [index[t.id] for t in rt.targets]
            demo = [index[a.id] for a in rt.attributes]
            test = torch.as_tensor(
                ds.matrix(keys=list(model.item_bank.keys), users=ds.split["test_users"]),  # type: ignore[index]
                dtype=torch.long,
            )
            selector = rt.selector if rt.selector is not None else get_criterion(rt.criterion)
            fixed = getattr(selector, "fixed", None) or get_criterion("fixed")
            uniform = _uniform_model(model.item_bank)
            scored = {
                "default": _score(model, selector, test, demo, cand, tgt, budget),
                "fixed": _score(model, fixed, test, demo, cand, tgt, budget),
                "uniform": _score(uniform, get_criterion("eig"), test, demo, cand, tgt, budget),
            }
            for m, res in scored.items():
                for c in CURVES:
                    curves[m][c].append(res[c])
            checkpoints.append(
                {"arrivals": target, "model_id": rt.model_id, "criterion": rt.criterion}
            )
        versions = [
            {
                "id": v.id,
                "status": v.status,
                "is_active": v.is_active,
                "n_live": v.n_live,
                "n_validation": v.n_validation,
                "val_log_loss": v.val_log_loss,
                "active_val_log_loss": v.active_val_log_loss,
                "reason": v.reason,
            }  # fmt: skip
            for v in reversed(model_versions(study.id or 0, session=db, limit=1000))
        ]
        n_sessions = len(
            db.exec(
                select(ElicitationSession.id).where(ElicitationSession.study_id == study.id)
            ).all()
        )
    engine.dispose()
    clear_runtime_cache()
    return {
        "curves": curves,
        "checkpoints": checkpoints,
        "versions": versions,
        "n_sessions": n_sessions,
        "n_questions": n_questions,
        "seconds": round(time.perf_counter() - started_at, 3),
    }


def _mean_se(values: list[list[list[float]]]) -> tuple[list[list[float]], list[list[float]]]:
    """Mean and standard error over runs of ``[runs][arrivals][budget + 1]`` curves (SE 0
    with one run)."""
    r = len(values)
    t = torch.tensor(values, dtype=torch.float64)
    mean = t.mean(0)
    se = t.std(0, unbiased=True) / math.sqrt(r) if r > 1 else torch.zeros_like(mean)
    return mean.tolist(), se.tolist()


def run_lifecycle(
    dataset: str | Path,
    arrivals: Sequence[int],
    budget: int,
    *,
    n_runs: int = 3,
    live_questions: int = 10,
    calibration_items: int = DEFAULT_CALIBRATION_ITEMS,
    calibration_min_answers: int = DEFAULT_CALIBRATION_MIN_ANSWERS,
    keep_db: Path | None = None,
    log: Callable[[str], None] = lambda _msg: None,
) -> dict[str, Any]:
    """Run the lifecycle benchmark (module docstring) and return its JSON object.

    Args:
        dataset: the dataset folder (canonical format, with a user split and runs).
        arrivals: increasing arrival counts at which the study is refitted and scored,
            e.g. ``[0, 50, 200, 800]`` (at most the number of train + val users).
        budget: ``T``, the most questions asked per test user.
        n_runs: the first ``n_runs`` runs of ``runs.csv``.
        live_questions: the study's ``budgets.max_questions`` (what live respondents answer).
        calibration_items: the study's ``calibration_items``.
        calibration_min_answers: the study's ``calibration_min_answers``.
        keep_db: a folder to keep each run's SQLite database in (default: a temporary one).
        log: receives one line per checkpoint.

    Returns:
        ``{"dataset", "arrivals": [A], "budget", "methods": {name: {"accuracy":
        [A][T + 1], "log_loss": [A][T + 1], "accuracy_se", "log_loss_se", "per_run":
        [...]}}, "protocol": {...}}``: index ``[a][n]`` is the metric after ``arrivals[a]``
        arrivals and ``n`` questions, averaged over the runs (SE: over the runs).

    Raises:
        InvalidInputError: bad arrivals, budget, runs or settings.
        DatasetError: the dataset folder is invalid.
    """
    path = Path(dataset)
    ds = load_dataset(path)
    arrivals = list(arrivals)
    users = _check(
        ds, arrivals, budget, n_runs, live_questions, calibration_items, calibration_min_answers
    )
    runs = ds.runs[:n_runs]
    per_run: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="priorly-lifecycle-") as tmp:
        folder = keep_db if keep_db is not None else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for run in runs:
            per_run.append(
                _lifecycle_run(
                    ds,
                    path,
                    run,
                    users,
                    arrivals,
                    budget,
                    live_questions,
                    calibration_items,
                    calibration_min_answers,
                    folder,
                    log,
                )  # fmt: skip
            )
    t0 = time.perf_counter()
    full = run_individual(ds, budget, ["default"], n_runs=n_runs, progress=False)
    full_seconds = round(time.perf_counter() - t0, 3)
    methods: dict[str, Any] = {}
    for name in ("default", "uniform", "fixed"):
        entry: dict[str, Any] = {}
        for c in CURVES:
            entry[c], entry[f"{c}_se"] = _mean_se([r["curves"][name][c] for r in per_run])
        entry["per_run"] = [
            {
                "seed": run.seed,
                **{c: r["curves"][name][c] for c in CURVES},
                **(
                    {
                        k: r[k]
                        for k in ("checkpoints", "versions", "n_sessions", "n_questions", "seconds")
                    }  # fmt: skip
                    if name == "default"
                    else {}
                ),
            }
            for run, r in zip(runs, per_run, strict=True)
        ]
        methods[name] = entry
    fh = full["methods"]["default"]["per_run"]
    entry = {}
    for c in CURVES:
        entry[c], entry[f"{c}_se"] = _mean_se([[e[c]] * len(arrivals) for e in fh])
    entry["per_run"] = [
        {"seed": e["seed"], **{c: [e[c]] * len(arrivals) for c in CURVES}} for e in fh
    ]
    entry["seconds"] = full_seconds
    methods["full_history"] = entry
    return {
        "dataset": ds.name,
        "arrivals": arrivals,
        "budget": budget,
        "methods": {m: methods[m] for m in METHODS},
        "protocol": {
            "runs": [r.seed for r in runs],
            "arriving_users": len(users),
            "test_users": len(ds.split["test_users"]),  # type: ignore[index]
            "live_questions": live_questions,
            "calibration_items": calibration_items,
            "calibration_min_answers": calibration_min_answers,
            "refits": "fit_study_model at each arrival count > 0 (promotion on held-out)",
            "cold_start": "the persona prior of a study without personas: one uniform persona",
            "index": "[arrival count][questions asked 0..budget]",
        },
    }


__all__ = ["CURVES", "METHODS", "parse_arrivals", "run_lifecycle"]
