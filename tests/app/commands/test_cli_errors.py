"""The ``priorly`` CLI: user errors print one line ``priorly: error: ...`` and exit 2,
without a traceback; success paths print what they did."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func
from sqlmodel import Session, select

from app.cli import main
from app.db import make_engine
from app.settings import get_settings
from app.tables import Respondent, Study

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def cli_db(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Point the CLI (in this process) at a fresh SQLite file."""
    monkeypatch.setenv("PRIORLY_DATABASE_URL", sqlite_url)
    monkeypatch.delenv("PRIORLY_ENV", raising=False)
    get_settings.cache_clear()
    yield sqlite_url
    get_settings.cache_clear()


def _corrupt_option(folder: Path) -> None:
    path = folder / "responses.csv"
    rows = list(csv.reader(path.open(newline="")))
    rows[12][rows[0].index("327a")] = "Z"
    with path.open("w", newline="") as fh:
        csv.writer(fh, lineterminator="\n").writerows(rows)


def _count(url: str, table: type) -> int:
    eng = make_engine(url)
    try:
        with Session(eng) as s:
            return int(s.exec(select(func.count()).select_from(table)).one())
    finally:
        eng.dispose()


def _one_error_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("priorly: error: ")
    return lines[0].removeprefix("priorly: error: ")


def test_import_then_duplicate(
    cli_db: str, small_dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["import", str(small_dataset), "--study", "Demo"]) == 0
    out = capsys.readouterr().out
    assert "imported study 'demo': 39 items, 30 respondents" in out
    assert _count(cli_db, Respondent) == 30

    assert main(["import", str(small_dataset), "--study", "demo"]) == 2
    captured = capsys.readouterr()
    assert _one_error_line(captured.err) == "a study with slug 'demo' already exists"
    assert _count(cli_db, Study) == 1 and _count(cli_db, Respondent) == 30


def test_invalid_dataset(
    cli_db: str, small_dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _corrupt_option(small_dataset)
    assert main(["import", str(small_dataset)]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        "responses.csv, row 12, column '327a': unknown option 'Z' (expected one of A, B)"
    )
    assert _count(cli_db, Study) == 0


def test_missing_folder(cli_db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import", str(tmp_path / "nowhere")]) == 2
    assert "dataset folder not found" in _one_error_line(capsys.readouterr().err)


def test_unknown_revision(cli_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "upgrade"]) == 0
    capsys.readouterr()
    assert main(["db", "downgrade", "nonsense"]) == 2
    assert "nonsense" in _one_error_line(capsys.readouterr().err)


def test_db_upgrade_downgrade(cli_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "upgrade"]) == 0
    assert _count(cli_db, Study) == 0  # the table exists
    assert main(["db", "downgrade", "base"]) == 0
    with pytest.raises(Exception, match="study"):
        _count(cli_db, Study)


def test_placeholder_secret_refused(
    cli_db: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PRIORLY_ENV", "prod")
    assert main(["db", "upgrade"]) == 2
    assert "PRIORLY_SECRET_KEY" in _one_error_line(capsys.readouterr().err)


# ----- the real process: exit status, stderr, no traceback --------------------------------


def _run(args: list[str], db_file: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {
        **os.environ,
        "PRIORLY_DATABASE_URL": f"sqlite:///{db_file}",
        "PRIORLY_ENV": "dev",
        **env,
    }
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=REPO_ROOT,
        timeout=300,
    )


def test_process_exit_codes(small_dataset: Path, tmp_path: Path) -> None:
    _corrupt_option(small_dataset)
    db_file = tmp_path / "cli.db"
    bad = _run(["import", str(small_dataset)], db_file)
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    assert bad.stderr.strip() == (
        "priorly: error: responses.csv, row 12, column '327a': unknown option 'Z' "
        "(expected one of A, B)"
    )

    secret = _run(["db", "upgrade"], db_file, PRIORLY_ENV="prod", PRIORLY_SECRET_KEY="x")
    assert secret.returncode == 2 and "Traceback" not in secret.stderr
    assert len(secret.stderr.strip().splitlines()) == 1
    assert "PRIORLY_SECRET_KEY" in secret.stderr

    # a worker whose Redis queue does not answer stops with one line (password hidden),
    # instead of logging a traceback several times a second
    assert _run(["db", "upgrade"], db_file).returncode == 0
    down = _run(["worker"], db_file, PRIORLY_REDIS_URL="redis://:s3cretpw@127.0.0.1:1/9")
    assert down.returncode == 2 and "Traceback" not in down.stderr, down.stderr
    assert down.stderr.startswith(
        "priorly: error: the job queue at redis://:***@127.0.0.1:1/9 does not answer"
    )
    assert len(down.stderr.strip().splitlines()) == 1 and "s3cretpw" not in down.stderr
    # the README's uvicorn command with unusable settings: one line and exit 2 too
    factory = subprocess.run(
        [sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory", "--port", "0"],
        capture_output=True,
        text=True,
        env={**os.environ, "PRIORLY_ENV": "prod", "PRIORLY_SECRET_KEY": "short"},
        cwd=REPO_ROOT,
        timeout=300,
    )
    assert factory.returncode == 2 and "Traceback" not in factory.stderr, factory.stderr
    assert factory.stderr.strip().splitlines()[-1].startswith("priorly: error: ")
    assert "PRIORLY_SECRET_KEY" in factory.stderr
    mysql = _run(["db", "upgrade"], db_file, PRIORLY_DATABASE_URL="mysql://u:S3cretPW@h/x")
    assert mysql.returncode == 2 and "S3cretPW" not in mysql.stderr
    assert "unsupported database URL 'mysql://u:***@h/x'" in mysql.stderr


def test_help_and_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for command in ("serve", "db", "import"):
        assert f"    {command} " in out
    with pytest.raises(SystemExit) as info:
        main(["import"])  # argparse: usage line + error line, exit 2
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("priorly import: error:")
