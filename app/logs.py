"""Log lines of the priorly processes: one format with the time, the level and the logger.

``priorly serve``, ``priorly worker`` and the app built by uvicorn's ``--factory`` call
:func:`configure_logging` with
``PRIORLY_LOG_LEVEL`` (``debug``, ``info`` (default), ``warning``, ``error``); the app's
loggers (``priorly.*``), the job queue's (``huey``) and uvicorn's (its access lines
included) then write lines such as::

    2026-12-05 01:44:02,118 INFO priorly.jobs: job 12 (fit_model) succeeded in 41.2 s
    2026-12-05 01:44:03,577 INFO uvicorn.access: 10.0.0.7:0 - "GET /s/ces HTTP/1.1" 200

to standard error, where the service manager collects them. Secrets in paths are redacted
(:mod:`app.middleware`).
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from app.middleware import RedactPathSecrets

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    """Send every logger's records at ``level`` or above to standard error as
    :data:`LOG_FORMAT` (the root logger's one handler), with the credentials in paths
    redacted on that handler (:class:`app.middleware.RedactPathSecrets`: every logger's
    records pass it, ``priorly.jobs`` included)."""
    logging.basicConfig(format=LOG_FORMAT, level=level.upper(), force=True)
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactPathSecrets())
    # the migration checks at each start would print alembic's context lines at INFO
    logging.getLogger("alembic").setLevel(max(logging.WARNING, logging.getLogger().level))


def uvicorn_log_config(level: str) -> dict[str, Any]:
    """uvicorn's logging configuration with :data:`LOG_FORMAT` (its default lines carry
    no time): for ``uvicorn.Config(log_config=...)``."""
    from uvicorn.config import LOGGING_CONFIG  # uvicorn is the server; imported to run it

    config = copy.deepcopy(LOGGING_CONFIG)
    for formatter in config["formatters"].values():
        formatter["fmt"] = LOG_FORMAT
        formatter["use_colors"] = False
    for logger in config["loggers"].values():
        logger["level"] = level.upper()
    return config
