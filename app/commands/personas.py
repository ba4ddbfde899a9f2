"""``priorly personas generate|table|bench``: LLM persona answer distributions.

``generate`` builds a study's persona dictionary (from its respondents' attribute profiles,
or from a file of researcher texts), stores it in ``study_persona``, and scores every
persona × question pair with a backend into ``persona_distribution`` — resumably: stored
pairs are never recomputed, each chunk is committed as soon as it is scored, and a
failing backend leaves a ``failed`` job row and nothing wrong stored (rerun to resume).
The work is :mod:`app.services.personas` (shared with the ``persona_generation`` job);
this command adds the job row, the progress bar and the JSON summary.

``table`` caches a dataset's persona table for the benchmark; ``bench`` measures
persona-item distributions per second (see docs/inference.md). The handlers import the
torch-heavy modules when they run, so that ``priorly --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from sqlmodel import Session
from tqdm import tqdm

from app import db
from app.errors import InvalidInputError
from app.services.studies import get_study_by_slug
from app.settings import get_settings
from app.tables import Job, JobStatus, utcnow
from inference_server.model_store import DEFAULT_MODEL

JOB_KIND = "persona_generation"

OPENAI_HELP = (
    "Backend openai: the server is --base-url, else the setting PRIORLY_LLM_BASE_URL; the "
    "model is --model, else PRIORLY_LLM_MODEL, else the embedded model's served name "
    f"({DEFAULT_MODEL}, what `priorly inference serve` serves by default); the API key "
    "comes only from the environment (PRIORLY_LLM_API_KEY, sent as a bearer token), never "
    "from the command line."
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "personas",
        help="persona answer distributions from language models",
        description="Persona dictionaries and their answer distributions from a language model.",
    )
    sub = parser.add_subparsers(dest="personas_command", metavar="ACTION", required=True)

    gen = sub.add_parser(
        "generate",
        help="score a study's personas x questions with a language model (resumable)",
        description=(
            "Build the study's persona dictionary and store one answer distribution per "
            "persona x question, keyed by (model, template version, persona hash, item hash). "
            "Stored pairs are never recomputed: rerun the same command to resume after a "
            "kill or a failure. " + OPENAI_HELP
        ),
    )
    gen.add_argument("--study", required=True, metavar="SLUG")
    gen.add_argument("--backend", choices=["local", "openai"], default="local")
    gen.add_argument(
        "--base-url",
        help="OpenAI-compatible server (backend openai; default: PRIORLY_LLM_BASE_URL)",
    )
    gen.add_argument(
        "--model",
        help="local: a model folder (default: the embedded SmolLM2); openai: the served name "
        f"(default: PRIORLY_LLM_MODEL, else {DEFAULT_MODEL})",
    )
    gen.add_argument(
        "--personas",
        default="from-attributes",
        metavar="from-attributes|FILE",
        help="attribute profiles of the study's respondents, or a .txt/.jsonl/.json file",
    )
    gen.add_argument("--profiles", choices=["profiles", "sample"], default="profiles")
    gen.add_argument(
        "--n-personas", type=int, default=None, help="most frequent profiles / sample size"
    )
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--limit", type=int, default=None, help="compute at most N new pairs")
    gen.add_argument("--chunk", type=int, default=32, help="pairs per committed chunk")
    gen.add_argument("--batch-size", type=int, default=8)
    gen.add_argument(
        "--concurrency", type=int, default=4, help="requests in flight (backend openai)"
    )
    gen.add_argument("--threshold", type=float, default=0.5, help="flag pairs below this mass")
    gen.add_argument("--threads", type=int, default=None, help="torch threads (local)")
    gen.set_defaults(func=_generate)

    table = sub.add_parser(
        "table",
        help="generate and cache a dataset's LLM persona table (for bench llm_personas/mixed)",
        description=(
            "Score the N most frequent attribute profiles of the dataset's training users on "
            "every question and cache the table under $PRIORLY_CACHE_DIR/persona_tables."
        ),
    )
    table.add_argument("--dataset", type=Path, required=True)
    table.add_argument("--n-personas", type=int, default=16)
    table.add_argument("--backend", choices=["local", "openai"], default="local")
    table.add_argument("--base-url", help="OpenAI-compatible server (backend openai)")
    table.add_argument("--model", default=None)
    table.add_argument("--batch-size", type=int, default=8)
    table.add_argument(
        "--concurrency", type=int, default=4, help="requests in flight (backend openai)"
    )
    table.add_argument("--threshold", type=float, default=0.5)
    table.add_argument("--threads", type=int, default=None)
    table.set_defaults(func=_table)

    bench = sub.add_parser(
        "bench",
        help="throughput of the backends (persona-item distributions per second)",
        description=(
            "Measure distributions/s for batch sizes and prefix reuse. Standard output holds "
            "only the JSON result; progress lines go to standard error. pairs_per_cpu_second "
            "counts this process's CPU, plus the server's for vllm; for openai only the "
            "client's (config.cpu_seconds_measured says which). " + OPENAI_HELP
        ),
    )
    bench.add_argument("--backend", choices=["local", "openai", "vllm"], default="local")
    bench.add_argument(
        "--base-url",
        help="an already running server (backend openai; default: PRIORLY_LLM_BASE_URL)",
    )
    bench.add_argument(
        "--model",
        default=None,
        help="the served model name (backend openai; default: PRIORLY_LLM_MODEL, "
        f"else {DEFAULT_MODEL})",
    )
    bench.add_argument("--dataset", type=Path, default=None, help="default: datasets/ces")
    bench.add_argument("--personas", type=int, default=4)
    bench.add_argument("--items", type=int, default=8)
    bench.add_argument("--batch-sizes", default="1,8,32")
    bench.add_argument("--threads", type=int, default=1)
    bench.add_argument(
        "--compile", action="store_true", help="vllm: compile graphs (slow start) instead of eager"
    )
    bench.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    bench.set_defaults(func=_bench)


def _backend(args: argparse.Namespace) -> Any:
    """The scoring backend of the ``--backend`` ... arguments."""
    from app.services import personas as personas_service  # torch-heavy: --help stays fast

    return personas_service.make_persona_backend(
        args.backend,
        base_url=args.base_url,
        model=args.model,
        batch_size=args.batch_size,
        concurrency=args.concurrency,
        threshold=args.threshold,
        threads=args.threads,
    )


def _study_personas(
    args: argparse.Namespace, study_id: int, attrs: list[Any], session: Session
) -> tuple[list[Any], str]:
    """The personas ``--personas`` names and their source: ``(personas, source)``.

    ``from-attributes`` builds them from the study's attribute items (``--profiles``,
    ``--n-personas``, ``--seed``); otherwise they are read from the file, the first
    ``--n-personas`` of it when given. ``source`` is ``"attributes"`` or ``"file"``.
    """
    # torch-heavy (inference_server), imported when the command runs: --help stays fast.
    from app.services import personas as personas_service
    from inference_server.personas import read_persona_file

    if args.personas == "from-attributes":
        if not attrs:
            raise InvalidInputError(f"study {args.study!r} has no attribute items")
        personas = personas_service.attribute_personas(
            study_id,
            attrs,
            mode=args.profiles,
            n=args.n_personas,
            seed=args.seed,
            session=session,
        )
        return personas, "attributes"
    personas = read_persona_file(args.personas)
    if args.n_personas is not None:
        personas = personas[: args.n_personas]
    return personas, "file"


def _start_job(args: argparse.Namespace, study_id: int, model_id: str, session: Session) -> Job:
    """A committed running ``Job`` of this command whose payload is its arguments and the
    ``model_id`` it scores with (which the persona prior then uses:
    :func:`app.services.persona_models.prior_group`)."""
    job = Job(
        kind=JOB_KIND,
        study_id=study_id,
        status=JobStatus.running.value,
        payload={
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"
        }
        | {"model_id": model_id},
        started_at=utcnow(),
        attempts=1,
    )
    session.add(job)
    session.commit()
    session.refresh(job)
    return job


def _fail_job(job: Job, exc: BaseException, session: Session) -> NoReturn:
    """Roll back, then mark ``job`` failed with ``exc``; re-raise an interrupt, else a user error.

    Raises:
        KeyboardInterrupt: ``exc`` itself when it is one.
        InvalidInputError: otherwise, naming the job (stored pairs are kept for a rerun).
    """
    session.rollback()
    job.status = JobStatus.failed.value
    job.error = f"{type(exc).__name__}: {exc}"
    job.finished_at = utcnow()
    session.add(job)
    session.commit()
    if isinstance(exc, KeyboardInterrupt):
        raise exc
    raise InvalidInputError(
        f"persona generation failed (job {job.id}; stored pairs are kept, rerun to resume): {exc}"
    ) from exc


def _finish_job(job: Job, result: dict, session: Session) -> None:
    """Mark ``job`` succeeded with ``result`` and commit it."""
    job.status = JobStatus.succeeded.value
    job.progress = 1.0
    job.result = result
    job.finished_at = utcnow()
    session.add(job)
    session.commit()


def _generate(args: argparse.Namespace) -> int:
    """``personas generate``: store the study's personas and score every persona-item pair.

    Creates a running job with the arguments as payload, scores the pairs not stored yet
    with the ``--backend`` (a progress bar on stderr), marks the job succeeded with the
    counts and rate and prints them as JSON; on a backend error or an interrupt the job is
    marked failed and the pairs already stored are kept.
    """
    # torch-heavy (inference_server), imported when the command runs: --help stays fast.
    from app.services import personas as personas_service
    from inference_server.errors import InferenceError

    settings = get_settings()
    db.upgrade(settings.database_url)
    engine = db.make_engine(settings.database_url)
    try:
        with Session(engine) as session:
            study = get_study_by_slug(args.study, session=session)
            assert study.id is not None
            attrs, questions = personas_service.study_items(study.id, session=session)
            if not questions:
                raise InvalidInputError(f"study {args.study!r} has no questions")
            personas, source = _study_personas(args, study.id, attrs, session)
            # the backend first: a server that is down or serves another model stores
            # nothing (InvalidInputError naming the URL and the served models)
            backend = _backend(args)
            personas_service.check_persona_backend(backend)
            added = personas_service.save_study_personas(
                study.id, personas, source, session=session, attrs=attrs
            )
            job = _start_job(args, study.id, backend.model_id, session)
            print(
                f"study {study.slug!r}: {len(personas)} personas ({added} new) x "
                f"{len(questions)} questions; job {job.id}",
                file=sys.stderr,
            )
            bar = tqdm(total=0, unit="pair", desc="distributions", file=sys.stderr)

            def progress(done: int, todo: int) -> None:
                bar.total = todo
                bar.n = done
                bar.refresh()

            try:
                stats = personas_service.score_personas(
                    [p.text for p in personas],
                    questions,
                    backend,
                    session=session,
                    chunk_size=args.chunk,
                    limit=args.limit,
                    on_progress=progress,
                )
            except (InferenceError, KeyboardInterrupt) as exc:
                bar.close()
                _fail_job(job, exc, session)
            bar.close()
            result = {
                "total_pairs": stats.total,
                "already_stored": stats.already_stored,
                "computed": stats.computed,
                "flagged": stats.flagged,
                "seconds": round(stats.seconds, 3),
                "pairs_per_second": round(stats.rate, 3),
                "model_id": backend.model_id,
                "template_version": backend.template.version_id,
            }
            _finish_job(job, result, session)
            print(json.dumps(result))
    finally:
        engine.dispose()
    return 0


def _table(args: argparse.Namespace) -> int:
    # torch-heavy and numpy, imported when the command runs: --help stays fast.
    from elicitation.datasets import load_dataset
    from inference_server.persona_table import build_table, table_path

    ds = load_dataset(args.dataset)
    backend = _backend(args)
    bar = tqdm(total=0, unit="pair", desc="persona table", file=sys.stderr)

    def progress(done: int, todo: int) -> None:
        bar.total = todo
        bar.n = done
        bar.refresh()

    t0 = time.perf_counter()
    table = build_table(ds, backend, n_personas=args.n_personas, on_progress=progress)
    bar.close()
    path = table.save(
        table_path(ds, backend.model_id, backend.template.version_id, len(table.texts))
    )
    flagged = int((table.valid_mass < args.threshold).sum())
    print(
        json.dumps(
            {
                "path": str(path),
                "personas": len(table.texts),
                "items": len(table.item_keys),
                "flagged_pairs": flagged,
                "seconds": round(time.perf_counter() - t0, 1),
            }
        )
    )
    return 0


def _bench(args: argparse.Namespace) -> int:
    """``personas bench``: the JSON result on stdout (and in ``--out``), progress on stderr.

    ``--backend openai`` resolves the server, model and key as ``generate`` does
    (:func:`app.services.personas.make_persona_backend`) and checks the server first.

    Raises:
        InvalidInputError: ``openai`` without ``--base-url`` nor ``PRIORLY_LLM_BASE_URL``;
            a server that is down or does not serve the model; ``--model`` or
            ``--base-url`` with another backend.
    """
    # torch-heavy (inference_server), imported when the command runs: --help stays fast.
    from app.services import personas as personas_service
    from inference_server.bench import run_bench

    openai_client = None
    if args.backend == "openai":

        def openai_client(batch_size: int) -> Any:
            return personas_service.make_persona_backend(
                "openai",
                base_url=args.base_url,
                model=args.model,
                batch_size=batch_size,
                concurrency=1,
            )

        personas_service.check_persona_backend(openai_client(1))
    elif args.model is not None or args.base_url is not None:
        raise InvalidInputError(
            f"--model and --base-url are for --backend openai, not {args.backend}"
        )
    sizes = [int(x) for x in str(args.batch_sizes).split(",") if x.strip()]
    result = run_bench(
        backend=args.backend,
        dataset=args.dataset,
        n_personas=args.personas,
        n_items=args.items,
        batch_sizes=sizes,
        threads=args.threads,
        eager=not args.compile,
        openai_client=openai_client,
    )
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0
