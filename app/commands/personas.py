"""``priorly personas generate|bench``: LLM persona answer distributions (issue 4).

``generate`` builds a study's persona dictionary (from its respondents' attribute profiles,
or from a file of researcher texts), stores it in ``study_persona``, and scores every
persona × question pair with a backend into ``persona_distribution`` — resumably: stored
pairs are never recomputed, each chunk is committed as soon as it is scored, and a
failing backend leaves a ``failed`` job row and nothing wrong stored (rerun to resume).

``bench`` measures persona-item distributions per second (see docs/inference.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlmodel import Session, select

from app import db
from app.errors import InvalidInputError
from app.settings import get_settings

JOB_KIND = "persona_generation"


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
            "kill or a failure."
        ),
    )
    gen.add_argument("--study", required=True, metavar="SLUG")
    gen.add_argument("--backend", choices=["local", "openai"], default="local")
    gen.add_argument("--base-url", help="OpenAI-compatible server (backend openai)")
    gen.add_argument(
        "--model",
        help="local: a model folder (default: the embedded SmolLM2); openai: the served name",
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
        description="Measure distributions/s for batch sizes and prefix reuse; prints JSON.",
    )
    bench.add_argument("--backend", choices=["local", "openai", "vllm"], default="local")
    bench.add_argument("--base-url", help="an already running server (backend openai)")
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


# ----- the database store ------------------------------------------------------------------


class SqlDistributionStore:
    """:class:`inference_server.generate.DistributionStore` on ``persona_distribution``."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def existing(self, keys: Sequence[Any]) -> set[Any]:
        from app.tables import PersonaDistribution
        from inference_server.generate import PairKey

        found: set[Any] = set()
        by_group: dict[tuple[str, str], list[Any]] = {}
        for k in keys:
            by_group.setdefault((k.model_id, k.template_version), []).append(k)
        for (model_id, version), group in by_group.items():
            persona_hashes = sorted({k.persona_hash for k in group})
            for start in range(0, len(persona_hashes), 500):
                rows = self.session.exec(
                    select(PersonaDistribution.persona_hash, PersonaDistribution.item_hash).where(
                        PersonaDistribution.model_id == model_id,
                        PersonaDistribution.template_version == version,
                        PersonaDistribution.persona_hash.in_(  # type: ignore[attr-defined]
                            persona_hashes[start : start + 500]
                        ),
                    )
                ).all()
                found.update(PairKey(model_id, version, ph, ih) for ph, ih in rows)
        return found & set(keys)

    def save(self, rows: Sequence[tuple[Any, Any]]) -> None:
        from app.tables import PersonaDistribution

        try:
            for key, score in rows:
                self.session.add(
                    PersonaDistribution(
                        model_id=key.model_id,
                        template_version=key.template_version,
                        persona_hash=key.persona_hash,
                        item_hash=key.item_hash,
                        probs=[float(p) for p in score.probs],
                        valid_mass=float(score.valid_mass),
                        flagged=bool(score.flagged),
                    )
                )
            self.session.commit()
        except BaseException:
            self.session.rollback()
            raise


def study_items(study_id: int, *, session: Session) -> tuple[list[Any], list[Any]]:
    """``(attribute codebook items, question prompt items)`` of a study, in position order."""
    from app.tables import Item, ItemRole
    from elicitation.datasets import CodebookItem
    from inference_server.prompts import PromptItem

    rows = session.exec(
        select(Item).where(Item.study_id == study_id).order_by(Item.position, Item.id)  # type: ignore[arg-type]
    ).all()
    attrs, questions = [], []
    for it in rows:
        opts = tuple((str(letter), str(label)) for letter, label in it.options)
        if it.role == ItemRole.attribute.value:
            attrs.append(
                CodebookItem(id=it.key, question=it.question, options=opts, topic=it.topic)
            )
        elif it.role in (ItemRole.question.value, ItemRole.target.value):
            questions.append(PromptItem(it.key, it.question, tuple(lb for _, lb in opts)))
    return attrs, questions


def attribute_matrix(study_id: int, attrs: Sequence[Any], *, session: Session) -> Any:
    """``int [N, A]`` option indices of the study's respondents' attributes (-1 missing)."""
    import numpy as np

    from app.tables import Respondent

    index = [{letter: k for k, (letter, _) in enumerate(a.options)} for a in attrs]
    rows = session.exec(select(Respondent.attributes).where(Respondent.study_id == study_id)).all()
    out = np.full((len(rows), len(attrs)), -1, dtype=np.int64)
    for r, values in enumerate(rows):
        for j, a in enumerate(attrs):
            letter = (values or {}).get(a.id)
            if letter is not None and letter in index[j]:
                out[r, j] = index[j][letter]
    return out


def save_study_personas(
    study_id: int, personas: Sequence[Any], source: str, *, session: Session
) -> int:
    """Add the personas the study does not have yet (by text hash); returns how many."""
    from app.tables import StudyPersona

    have = set(
        session.exec(select(StudyPersona.text_hash).where(StudyPersona.study_id == study_id)).all()
    )
    added = 0
    for p in personas:
        if p.hash in have:
            continue
        session.add(
            StudyPersona(
                study_id=study_id,
                key=p.key[:200],
                text=p.text,
                text_hash=p.hash,
                weight=p.weight,
                source=source,
            )
        )
        have.add(p.hash)
        added += 1
    session.commit()
    return added


def _make_backend(args: argparse.Namespace) -> Any:
    from inference_server.backends import make_backend

    if args.backend == "openai":
        settings = get_settings()
        base_url = args.base_url or settings.llm_base_url
        if not base_url:
            raise InvalidInputError("--backend openai needs --base-url or PRIORLY_LLM_BASE_URL")
        from inference_server.model_store import DEFAULT_MODEL

        key = settings.llm_api_key
        return make_backend(
            "openai",
            base_url=base_url,
            model=args.model or settings.llm_model or DEFAULT_MODEL,
            api_key=key.get_secret_value() if key is not None else None,
            batch_size=args.batch_size,
            concurrency=args.concurrency,
            threshold=args.threshold,
        )
    return make_backend(
        "local",
        model=args.model,
        batch_size=args.batch_size,
        threshold=args.threshold,
        num_threads=args.threads,
    )


def _generate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from app.services.studies import get_study_by_slug
    from app.tables import Job, JobStatus, utcnow
    from inference_server.errors import InferenceError
    from inference_server.generate import generate
    from inference_server.personas import profiles_from_matrix, read_persona_file

    settings = get_settings()
    db.upgrade(settings.database_url)
    engine = db.make_engine(settings.database_url)
    try:
        with Session(engine) as session:
            study = get_study_by_slug(args.study, session=session)
            assert study.id is not None
            attrs, questions = study_items(study.id, session=session)
            if not questions:
                raise InvalidInputError(f"study {args.study!r} has no questions")
            if args.personas == "from-attributes":
                if not attrs:
                    raise InvalidInputError(f"study {args.study!r} has no attribute items")
                matrix = attribute_matrix(study.id, attrs, session=session)
                personas = profiles_from_matrix(
                    attrs, matrix, mode=args.profiles, n=args.n_personas, seed=args.seed
                )
                source = "attributes"
            else:
                personas = read_persona_file(args.personas)
                if args.n_personas is not None:
                    personas = personas[: args.n_personas]
                source = "file"
            added = save_study_personas(study.id, personas, source, session=session)
            job = Job(
                kind=JOB_KIND,
                study_id=study.id,
                status=JobStatus.running.value,
                payload={
                    k: (str(v) if isinstance(v, Path) else v)
                    for k, v in vars(args).items()
                    if k != "func"
                },
                started_at=utcnow(),
                attempts=1,
            )
            session.add(job)
            session.commit()
            session.refresh(job)
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

            store = SqlDistributionStore(session)
            try:
                backend = _make_backend(args)
                stats = generate(
                    [p.text for p in personas],
                    questions,
                    backend,
                    store,
                    chunk_size=args.chunk,
                    limit=args.limit,
                    on_progress=progress,
                )
            except (InferenceError, KeyboardInterrupt) as exc:
                bar.close()
                session.rollback()
                job.status = JobStatus.failed.value
                job.error = f"{type(exc).__name__}: {exc}"
                job.finished_at = utcnow()
                session.add(job)
                session.commit()
                if isinstance(exc, KeyboardInterrupt):
                    raise
                raise InvalidInputError(
                    f"persona generation failed (job {job.id}; stored pairs are kept, rerun "
                    f"to resume): {exc}"
                ) from exc
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
            job.status = JobStatus.succeeded.value
            job.progress = 1.0
            job.result = result
            job.finished_at = utcnow()
            session.add(job)
            session.commit()
            print(json.dumps(result))
    finally:
        engine.dispose()
    return 0


def _table(args: argparse.Namespace) -> int:
    import time

    from tqdm import tqdm

    from elicitation.datasets import load_dataset
    from inference_server.persona_table import build_table, table_path

    ds = load_dataset(args.dataset)
    backend = _make_backend(args)
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
    from inference_server.bench import run_bench

    sizes = [int(x) for x in str(args.batch_sizes).split(",") if x.strip()]
    result = run_bench(
        backend=args.backend,
        base_url=args.base_url,
        dataset=args.dataset,
        n_personas=args.personas,
        n_items=args.items,
        batch_sizes=sizes,
        threads=args.threads,
        eager=not args.compile,
    )
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0
