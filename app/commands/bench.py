"""``priorly bench``: the benchmarks of the elicitation engine.

Subcommands are listed in :data:`SUBCOMMANDS` (name → help, argument builder, handler);
adding one is one entry. The elicitation package's errors (``ElicitationError``, the
dataset loader's ``DatasetError``, ``ModelError``) are user errors
(:func:`app.errors.is_user_error`): the CLI prints them as one line with exit code 2.
Output files are written whole or not at all (a temporary file renamed into place).

A handler imports the torch-heavy benchmark modules when it runs, so that registering the
command (every ``priorly`` invocation, ``--help`` included) stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.errors import InvalidInputError
from app.schemas import StudySettings
from elicitation.bench.defaults import DEFAULT_GROUP_METHODS, DEFAULT_METHODS

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PERSONAS = REPO_ROOT / "datasets" / "wvs_personas"

Handler = Callable[[argparse.Namespace], int]


def _write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (temporary file, then rename), with the
    mode a plain ``open`` would give it (``0o666`` less the umask; ``mkstemp`` makes 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(obj, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _methods_arg(text: str) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected a comma-separated list of method names")
    return names


# ---- arguments shared by several subcommands ---------------------------------------------
# Their names, defaults and help texts are a public interface: keep each byte-identical.
def _add_dataset(
    p: argparse.ArgumentParser, help: str = "dataset folder (canonical format)"
) -> None:
    """``--dataset DIR`` (required): the dataset folder to benchmark on."""
    p.add_argument("--dataset", required=True, type=Path, metavar="DIR", help=help)


def _add_out(p: argparse.ArgumentParser, what: str) -> None:
    """``--out FILE`` (required): where to write the result; help ``"<what> to write"``."""
    p.add_argument("--out", required=True, type=Path, metavar="FILE", help=f"{what} to write")


def _add_budget(p: argparse.ArgumentParser) -> None:
    """``--budget T``: questions per test user (default 10)."""
    p.add_argument(
        "--budget", type=int, default=10, metavar="T", help="questions per test user (default 10)"
    )


def _add_cache(p: argparse.ArgumentParser) -> None:
    """``--cache DIR``: a folder to store and reuse the fitted models in."""
    p.add_argument("--cache", type=Path, metavar="DIR", help="store / reuse the fitted models")


def _add_threads(p: argparse.ArgumentParser) -> None:
    """``--threads N``: torch threads (default 1)."""
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")


def _add_seed(p: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--seed SEED`` (default 0); ``help=None`` leaves it without a help text."""
    p.add_argument("--seed", type=int, default=0, help=help)


# ---- individual -------------------------------------------------------------------------
def _add_individual(p: argparse.ArgumentParser) -> None:
    _add_dataset(p)
    _add_budget(p)
    _add_out(p, "result.json")
    p.add_argument(
        "--plot", type=Path, metavar="PNG", help="also plot accuracy and log loss to this PNG"
    )
    p.add_argument(
        "--methods",
        type=_methods_arg,
        default=list(DEFAULT_METHODS),
        metavar="M1,M2",
        help=f"methods to run (default {','.join(DEFAULT_METHODS)})",
    )
    p.add_argument("--runs", type=int, metavar="N", help="use only the first N runs of runs.csv")
    _add_seed(p, help="seed of the model fits (default 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_threads(p)
    p.add_argument(
        "--no-cape-measures",
        action="store_true",
        help="skip questions_to_90pct and adaptivity (a second pass over the runs)",
    )


def _individual(args: argparse.Namespace) -> int:
    # torch-heavy, imported when the command runs (``priorly --help`` stays fast).
    # model_choice and bench_methods register more methods with the harness:
    # cape_cooccurrence, cape_linear, cape_factor and auto; llm_personas and mixed.
    import torch

    import elicitation.model_choice  # noqa: F401
    import inference_server.bench_methods  # noqa: F401
    from elicitation.bench.individual import run_individual
    from elicitation.bench.plot import plot_curves
    from elicitation.cape_measures import cape_measures

    if args.threads < 1:
        raise InvalidInputError(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    fits: dict[str, Any] = {}  # shared by the benchmark and the CAPE measures' pass
    result = run_individual(
        args.dataset,
        args.budget,
        args.methods,
        n_runs=args.runs,
        seed=args.seed,
        progress=not args.no_progress,
        cache=fits,
    )
    if not args.no_cape_measures:
        # CAPE's measures: questions_to_90pct, log_loss_all_candidates, adaptivity and
        # adaptivity_pairs, added to each adaptive method's entry.
        measures = cape_measures(args.dataset, result, n_runs=args.runs, seed=args.seed, cache=fits)
        for name, extra in measures.items():
            result["methods"][name].update(extra)
    _write_json(args.out, result)
    if args.plot is not None:
        plot_curves(result, args.plot)
    budget = result["budget"]
    shown = [n for n in (0, 1, 3, 5, budget) if n <= budget]
    shown = sorted(set(shown))
    head = "method".ljust(10) + "".join(f"  acc@{n:<3d} ll@{n:<3d}" for n in shown)
    print(head)
    for name, res in result["methods"].items():
        cells = "".join(f"  {res['accuracy'][n]:.4f} {res['log_loss'][n]:.4f}" for n in shown)
        print(name.ljust(10) + cells)
    print(f"wrote {args.out}" + (f" and {args.plot}" if args.plot else ""))
    return 0


# ---- speed ------------------------------------------------------------------------------
def _add_speed(p: argparse.ArgumentParser) -> None:
    _add_out(p, "speed.json")
    p.add_argument(
        "--steps", type=int, default=1000, help="timed single-respondent steps (default 1000)"
    )
    p.add_argument(
        "--batch",
        type=int,
        default=1000,
        help="respondents in the batched measurement (default 1000)",
    )
    p.add_argument(
        "--personas",
        default=str(DEFAULT_PERSONAS),
        metavar="DIR|N",
        help="persona dictionary folder (default: the bundled datasets/wvs_personas), or a "
        "number N: the bundled dictionary grown to N personas (e.g. 20000)",
    )
    p.add_argument(
        "--compress",
        choices=("auto", "none"),
        default="auto",
        help="auto (default): compress a dictionary of more than 2,000 personas to 500 "
        "prototypes as the live persona prior does; none: step on the whole dictionary",
    )
    _add_threads(p)
    _add_seed(p)
    live = StudySettings().criterion
    p.add_argument(
        "--criterion",
        default=live,
        help=f"selection criterion of the live step (default: a new study's, {live})",
    )


def _speed(args: argparse.Namespace) -> int:
    from elicitation.bench.speed import run_speed  # torch-heavy (``--help`` stays fast)

    folder, n_personas = Path(args.personas), None
    if args.personas.isdigit():
        folder, n_personas = DEFAULT_PERSONAS, int(args.personas)
    result = run_speed(
        folder,
        n_personas=n_personas,
        compress=args.compress,
        steps=args.steps,
        batch=args.batch,
        threads=args.threads,
        seed=args.seed,
        criterion=args.criterion,
    )
    _write_json(args.out, result)
    print(
        f"live step p50 {result['p50_ms']:.2f} ms, p99 {result['p99_ms']:.2f} ms over "
        f"{result['steps']} steps; batch of {result['batch_size']}: "
        f"{result['batch_steps_per_second']:.0f} respondent-steps/s"
    )
    print(
        f"CPU p50 {result['p50_cpu_ms']:.2f} ms, p99 {result['p99_cpu_ms']:.2f} ms; "
        f"{result['personas']} personas, {result['live_personas']} in the live step"
    )
    print(f"wrote {args.out}")
    return 0


# ---- group (logic in elicitation/group_bench.py) -----------------------------------------
def _add_group(p: argparse.ArgumentParser) -> None:
    _add_dataset(p, help="dataset folder")
    p.add_argument(
        "--respondent-budget",
        type=float,
        default=0.1,
        metavar="B",
        help="respondents per round: a share <= 1 or a count > 1 (default 0.1)",
    )
    p.add_argument("--rounds", type=int, default=4, help="rounds per run (default 4)")
    _add_out(p, "result.json")
    p.add_argument("--plot", type=Path, metavar="PNG", help="also plot the curves to this PNG")
    p.add_argument("--nonresponse", type=float, default=0.0, help="non-response rate (default 0)")
    p.add_argument(
        "--methods",
        type=_methods_arg,
        default=list(DEFAULT_GROUP_METHODS),
        help=f"comma-separated (default {','.join(DEFAULT_GROUP_METHODS)})",
    )
    p.add_argument("--runs", type=int, default=None, help="use only the first N runs")
    _add_cache(p)
    _add_threads(p)
    _add_seed(p)


def _group(args: argparse.Namespace) -> int:
    # torch-heavy, imported when the command runs (``priorly --help`` stays fast).
    import torch

    from elicitation.bench.plot import plot_group
    from elicitation.group_bench import run_group

    torch.set_num_threads(args.threads)
    budget: float | int = args.respondent_budget
    if budget > 1:
        budget = int(budget)
    result = run_group(
        args.dataset,
        budget,
        args.rounds,
        args.methods,
        nonresponse=args.nonresponse,
        n_runs=args.runs,
        seed=args.seed,
        cache=args.cache,
    )
    _write_json(args.out, result)
    if args.plot is not None:
        plot_group(result, args.plot)
    print("method".ljust(26) + "".join(f"  acc@{r}  " for r in range(args.rounds + 1)))
    for name, res in result["methods"].items():
        print(name.ljust(26) + "".join(f"  {v:.4f}" for v in res["accuracy"]))
    print(f"wrote {args.out}" + (f" and {args.plot}" if args.plot else ""))
    return 0


def _add_group_speed(p: argparse.ArgumentParser) -> None:
    _add_dataset(p, help="dataset folder")
    _add_out(p, "speed.json")
    p.add_argument(
        "--members",
        type=_methods_arg,
        default=["0", "10000", "100000"],
        help="group sizes, 0 = the real test users (default 0,10000,100000)",
    )
    p.add_argument("--respondent-budget", type=float, default=0.1)
    p.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="rounds of the budget whose first round is timed (default 4)",
    )
    p.add_argument("--no-train", action="store_true", help="do not time GNN training")
    _add_cache(p)
    _add_threads(p)
    _add_seed(p)


def _group_speed(args: argparse.Namespace) -> int:
    from elicitation.group_bench import run_group_speed  # torch-heavy (``--help`` stays fast)

    try:
        result = run_group_speed(
            args.dataset,
            sizes=[int(m) for m in args.members],
            respondent_budget=args.respondent_budget,
            rounds=args.rounds,
            train=not args.no_train,
            threads=args.threads,
            seed=args.seed,
            cache=args.cache,
        )
    except ValueError as exc:  # a bad --members value, among others
        raise InvalidInputError(str(exc)) from None
    _write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


# ---- lifecycle ----------------------------------------------------------------------------
_STUDY_DEFAULTS = StudySettings()


def _add_lifecycle(p: argparse.ArgumentParser) -> None:
    _add_dataset(p)
    p.add_argument(
        "--arrivals",
        default="0,50,200,800",
        metavar="A1,A2",
        help="increasing arrival counts at which the study is refitted and scored "
        "(default 0,50,200,800)",
    )
    _add_budget(p)
    p.add_argument(
        "--runs", type=int, default=3, metavar="N", help="first N runs of runs.csv (default 3)"
    )
    p.add_argument(
        "--live-questions",
        type=int,
        default=_STUDY_DEFAULTS.budgets.max_questions,
        metavar="M",
        help="the study's budgets.max_questions: what each arriving respondent answers "
        f"(default {_STUDY_DEFAULTS.budgets.max_questions}, a new study's)",
    )
    p.add_argument(
        "--calibration-items",
        type=int,
        default=_STUDY_DEFAULTS.calibration_items,
        metavar="C",
        help="the study's calibration_items: its last places go to random question and target "
        f"items (default {_STUDY_DEFAULTS.calibration_items}, a new study's)",
    )
    p.add_argument(
        "--calibration-min-answers",
        type=int,
        default=_STUDY_DEFAULTS.calibration_min_answers,
        metavar="N",
        help="the study's calibration_min_answers: calibration is asked while an item has fewer "
        f"observed answers (0: always; default {_STUDY_DEFAULTS.calibration_min_answers}, "
        "a new study's)",
    )
    _add_out(p, "result JSON")
    p.add_argument(
        "--keep-db", type=Path, metavar="DIR", help="keep each run's SQLite database here"
    )
    _add_threads(p)


def _lifecycle(args: argparse.Namespace) -> int:
    # torch-heavy, imported when the command runs (``priorly --help`` stays fast)
    import torch

    from app.services.lifecycle_bench import parse_arrivals, run_lifecycle

    if args.threads < 1:
        raise InvalidInputError(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    result = run_lifecycle(
        args.dataset,
        parse_arrivals(args.arrivals),
        args.budget,
        n_runs=args.runs,
        live_questions=args.live_questions,
        calibration_items=args.calibration_items,
        calibration_min_answers=args.calibration_min_answers,
        keep_db=args.keep_db,
        log=lambda msg: print(msg, file=sys.stderr),
    )
    _write_json(args.out, result)
    budget = result["budget"]
    print("method".ljust(13) + "".join(f"  ll@{budget} a={a:<5d}" for a in result["arrivals"]))
    for name, res in result["methods"].items():
        print(name.ljust(13) + "".join(f"  {row[budget]:<12.4f}" for row in res["log_loss"]))
    print(f"wrote {args.out}")
    return 0


SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Handler]] = {
    "individual": (
        "replay real respondents: target accuracy/log loss after 0..T questions per method",
        _add_individual,
        _individual,
    ),
    "speed": (
        "latency of one live step (update + choose the next item) with the WVS personas",
        _add_speed,
        _speed,
    ),
    "group": (
        "group rounds on the published protocol: target accuracy after rounds 0..R per method",
        _add_group,
        _group,
    ),
    "lifecycle": (
        "a study without history learning from live respondents: target log loss per arrivals",
        _add_lifecycle,
        _lifecycle,
    ),
    "group-speed": (
        "GNN training time and round planning time for 1k / 10k / 100k members",
        _add_group_speed,
        _group_speed,
    ),
}


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``bench`` and its subcommands (each sets ``func`` to its handler)."""
    bench = subparsers.add_parser(
        "bench", help="benchmarks of the elicitation engine", description=__doc__.splitlines()[0]
    )
    sub = bench.add_subparsers(dest="bench_command", metavar="SUBCOMMAND", required=True)
    for name, (help_text, add_args, handler) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_args(p)
        p.set_defaults(func=handler)
    return bench


if __name__ == "__main__":  # pragma: no cover - convenience for running without the CLI
    parser = argparse.ArgumentParser(prog="priorly")
    register(parser.add_subparsers(dest="command", required=True))
    ns = parser.parse_args()
    sys.exit(ns.func(ns))
