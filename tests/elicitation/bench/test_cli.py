"""``priorly bench``: argument handling and one-line user errors (exit code 2)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from app.cli import main
from tests.support.elicitation_cases import write_tiny_dataset


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_dataset(tmp_path_factory.mktemp("cli") / "tiny", n_users=90)


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--budget", "-1"], "budget must be an integer >= 0"),
        (["--methods", "default,magic"], "unknown benchmark method 'magic'"),
        (["--runs", "7"], "runs must be between 1 and 2"),
        (["--threads", "0"], "--threads must be >= 1"),
    ],
)
def test_individual_user_errors(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    out = tmp_path / "r.json"
    code = main(
        ["bench", "individual", "--dataset", str(tiny), "--out", str(out), "--no-progress", *extra]
    )
    assert code == 2
    assert message in _err(capsys)
    assert not out.exists()  # nothing half-written


def test_missing_dataset_and_bad_personas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "bench",
            "individual",
            "--dataset",
            str(tmp_path / "nope"),
            "--out",
            str(tmp_path / "r.json"),
        ]
    )
    assert code == 2 and "not found" in _err(capsys)
    code = main(["bench", "speed", "--personas", str(tmp_path), "--out", str(tmp_path / "s.json")])
    assert code == 2 and "does not exist" in _err(capsys)


def test_individual_writes_result_and_plot(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, png = tmp_path / "r.json", tmp_path / "c.png"
    code = main(
        [
            "bench",
            "individual",
            "--dataset",
            str(tiny),
            "--budget",
            "2",
            "--out",
            str(out),
            "--plot",
            str(png),
            "--methods",
            "random,full",
            "--runs",
            "1",
            "--no-progress",
        ]
    )
    assert code == 0
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # as open() makes it, not 0600
    res = json.loads(out.read_text())
    assert res["budget"] == 2 and list(res["methods"]) == ["random", "full"]
    assert len(res["methods"]["random"]["accuracy"]) == 3
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "random" in capsys.readouterr().out
    # CAPE's measures: for the adaptive method, not for ``full`` (all candidates observed).
    rnd = res["methods"]["random"]
    assert rnd["log_loss_all_candidates"] <= rnd["log_loss"][0] + 1e-9
    q = rnd["questions_to_90pct"]
    assert q is None or 0 <= q <= 2
    assert rnd["adaptivity_pairs"] >= 0
    assert rnd["adaptivity"] is None or 0.0 <= rnd["adaptivity"] <= 1.0
    assert "questions_to_90pct" not in res["methods"]["full"]
