"""Keeping secrets out of log lines.

Three links carry a credential in their path, by design (a person follows them without
any other credential): a respondent's resume link ``/s/{slug}/resume/{token}``, an
invitation ``/admin/invite/{token}`` and a group-round member link ``/g/{token}``. The ASGI
server's access log writes every request path, so without care these tokens would end up
in log files (and in whatever collects them). :class:`RedactPathSecrets` is a logging
filter that replaces the token part of such paths with ``[redacted]`` in every record of
the loggers it is attached to; :func:`install_log_redaction` attaches it to uvicorn's
access and error loggers and to the app's own (``priorly``).
"""

from __future__ import annotations

import logging
import re

SECRET_PATHS = re.compile(r"(/resume/|/admin/invite/|/g/)([^/?#\s\"']+)")
"""Path segments that are credentials: the segment after any of these prefixes."""

REDACTED = "[redacted]"
LOGGERS = ("uvicorn.access", "uvicorn.error", "uvicorn", "priorly")


def redact(text: str) -> str:
    """``text`` with the token segment of every credential-bearing path replaced."""
    return SECRET_PATHS.sub(lambda m: m.group(1) + REDACTED, text)


class RedactPathSecrets(logging.Filter):
    """Rewrite a record's message arguments (and message) so no path token is logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {
                k: redact(v) if isinstance(v, str) else v for k, v in record.args.items()
            }
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        return True


_FILTER = RedactPathSecrets()


def install_log_redaction() -> None:
    """Attach the filter to uvicorn's and the app's loggers (idempotent)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
