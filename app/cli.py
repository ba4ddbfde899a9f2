"""The ``priorly`` command line.

Command groups live in ``app/commands/<name>.py``; each module exposes
``register(subparsers)``, which adds its sub-command(s) and sets ``func`` (a callable
``(args) -> int | None``) as the parser default. :data:`COMMAND_MODULES` lists them in
``--help`` order; a listed module that is not installed is skipped, one that exists but
fails to import is a bug and raises. ``register`` runs for every invocation (even
``--help``), so it must stay cheap: a handler imports torch-heavy modules when it runs.

User errors (:func:`app.errors.is_user_error`: the app's :class:`~app.errors.PriorlyError`
and the pure packages' base errors) are printed as one line, ``priorly: error: <message>``,
with exit code 2 and no traceback; any other exception keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

from app.errors import error_line, is_user_error

PROG = "priorly"
EXIT_USER_ERROR = 2

COMMAND_MODULES: list[str] = [
    "app.commands.serve",
    "app.commands.db",
    "app.commands.importing",
    "app.commands.bench",
    "app.commands.inference",
    "app.commands.personas",
    "app.commands.user",
    "app.commands.apikey",
    "app.commands.worker",
    "app.commands.password",
]


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every available command group registered."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="priorly: adaptive Bayesian surveys and preference elicitation.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        if _module_exists(name):
            importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 success, 2 user error, 130 interrupted)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if not is_user_error(exc):
            raise
        print(f"{PROG}: error: {error_line(exc)}", file=sys.stderr)
        return EXIT_USER_ERROR
    return int(code or 0)


def run() -> None:  # pragma: no cover - console-script shim
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
