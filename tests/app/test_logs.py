"""Log lines of the priorly processes (app/logs.py): time, level and logger on each."""

from __future__ import annotations

import logging
import re

import pytest

from app.logs import LOG_FORMAT, configure_logging, uvicorn_log_config


def test_lines_carry_time_level_and_logger(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    try:
        configure_logging("warning")
        logging.getLogger("priorly.jobs").info("not shown below the level")
        logging.getLogger("priorly.jobs").warning("job 3 (fit_model, study 1) failed")
        logging.getLogger("priorly.jobs").warning("GET /s/ces/resume/tok3n-secret-value")
        err = capsys.readouterr().err
    finally:
        root.handlers[:], root.level = before
    assert "not shown" not in err
    assert "tok3n-secret-value" not in err and "/s/ces/resume/[redacted]" in err
    assert re.search(
        r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING priorly.jobs: job 3 \(fit_model", err, re.M
    ), err


def test_uvicorn_lines_use_the_same_format() -> None:
    config = uvicorn_log_config("error")
    assert {f["fmt"] for f in config["formatters"].values()} == {LOG_FORMAT}
    assert {logger["level"] for logger in config["loggers"].values()} == {"ERROR"}
