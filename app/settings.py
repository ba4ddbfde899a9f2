"""Application settings, read from the environment (prefix ``PRIORLY_``).

Every setting of the app is a field of :class:`Settings`; nothing else in ``app`` reads
``os.environ``. ``get_settings()`` is cached: every part of the app sees the same object,
read when first used (never at import). Tests and the CLI may build a :class:`Settings`
directly and pass it to ``create_app``.

Example::

    >>> Settings(database_url="postgres://u@db/p").database_url
    'postgresql+psycopg://u@db/p'
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.errors import ConfigurationError

REPO_ROOT = Path(__file__).resolve().parent.parent
"""The project folder (the app is installed editable from it)."""

PLACEHOLDER_SECRET = "dev-insecure-change-me"
_PLACEHOLDERS = {PLACEHOLDER_SECRET, "", "change-me", "changeme", "secret", "dev"}


def normalise_database_url(url: str) -> str:
    """Use the psycopg (v3) driver for PostgreSQL URLs written without a driver.

    ``postgresql://`` and ``postgres://`` would select psycopg2, which the project does not
    depend on; ``postgresql+psycopg://`` is the supported form.
    """
    url = url.strip()
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def redact_url(url: str) -> str:
    """``url`` with its password (the part between ``user:`` and ``@``) replaced by
    ``***``, for messages and logs.

    >>> redact_url("redis://:s3cret@10.0.0.2:6379/0")
    'redis://:***@10.0.0.2:6379/0'
    >>> redact_url("sqlite:///priorly.db")
    'sqlite:///priorly.db'
    """
    return re.sub(r"^([a-zA-Z][\w+.-]*://[^:/@]*:)[^@/]*@", r"\1***@", url)


class Settings(BaseSettings):
    """Settings of one priorly deployment.

    Attributes:
        database_url: SQLAlchemy URL; a SQLite file in the working directory by default,
            ``postgresql+psycopg://user@host:5432/db`` for PostgreSQL.
        env: ``dev`` (default), ``test`` or ``prod``. Outside ``dev`` a real secret key
            is required.
        secret_key: signs session cookies and tokens.
        host, port: where ``priorly serve`` listens.
        demo_dataset: the dataset folder imported as the demo study by ``priorly serve``
            when the database has no study.
        redis_url: the job queue's Redis (``PRIORLY_REDIS_URL``) when workers run on
            several machines; unset: a SQLite queue file (``queue_path``, default
            ``priorly-queue.db`` next to a SQLite database, else in the working directory).
            When set, the API rate limiter's counters live there too (app/ratelimit.py).
        job_stale_after_s: a running job whose worker sent no heartbeat for this long is
            retried by another worker.
        max_body_bytes: the largest request body accepted (JSON API, forms); larger ones
            are refused with 413 before they are read (app/limits.py).
        max_upload_bytes: the same for the admin file uploads (a dataset of several CSV/JSONL
            files, a persona file).
        login_max_failures_per_account, login_max_failures_per_ip, login_lockout_s: after
            this many failed logins for one email / from one address within
            ``login_lockout_s`` seconds, logins are refused (429) until the window ends
            (app/ratelimit.py; counters in the database, shared by all processes).
        api_rate_limit_per_minute: the most ``/api/v1`` calls per minute per API key
            (429 beyond; 0 turns the limit off).
        session_rate_limit_per_minute: the same per session token, and per client
            address for calls without a credential.
        db_pool_size, db_max_overflow: PostgreSQL connections per engine (a pool of
            ``db_pool_size`` plus up to ``db_max_overflow`` more under load); PostgreSQL's
            ``max_connections`` must exceed ``processes x (pool + overflow)``
            (:func:`app.db.make_engine`).
        torch_threads: torch intra-op threads in a process that serves sessions or runs
            jobs (:func:`app.services.belief.model_from_blob`); 1 by default, since a
            request's torch work is a few tiny products and requests run in parallel.
        gc_freeze: freeze long-lived objects out of the garbage collector's full
            collections (:mod:`app.gcfreeze`); ``PRIORLY_GC_FREEZE=0`` turns it off.
        respondent_start_rate_limit_per_minute: the most respondents one client address
            may start (consent on the survey pages) per minute (429 beyond; 0: no limit);
            the survey pages' other posts count against ``session_rate_limit_per_minute``
            per address.
        trusted_proxies: comma-separated addresses (or CIDR networks, or ``*``) of the
            reverse proxies / load balancers in front of the app. Only for a request from
            one of them is the client address taken from ``X-Forwarded-For`` (and the
            scheme from ``X-Forwarded-Proto``); every per-address limit (login lockout,
            API and survey-page limits) uses that address. Default: the local machine
            only. Behind a balancer at 10.0.0.5: ``PRIORLY_TRUSTED_PROXIES=10.0.0.5``.
            Never ``*`` on a server clients can reach directly (anyone could then choose
            their address).
        api_cors_origins: comma-separated origins (``https://app.example.com``) whose web
            pages may call ``/api/v1`` from the browser (CORS: the preflight and the
            ``Access-Control-Allow-Origin`` header, ``Authorization`` and ``Content-Type``
            allowed, no cookies). Default: none, the API is for servers. ``*`` allows
            every origin (the credentials are bearer values, never cookies).
        log_level: the least severe log lines ``priorly serve`` and ``priorly worker``
            write (``debug``, ``info``, ``warning``, ``error``), each with its time, level
            and logger (:mod:`app.logs`).
        step_memo_size: answer steps (state and answer -> new state and next question)
            each process keeps per study design and reuses for respondents who gave the
            same answers (``app.session.StepMemo``); 0 turns it off.
        max_study_personas: the most personas a study's persona dictionary may hold
            (:func:`app.services.personas.save_study_personas`; docs/personas.md): a
            generation job scores every persona × question pair, at a few pairs per second
            with the embedded model, while it holds the worker every study shares.
    """

    model_config = SettingsConfigDict(env_prefix="PRIORLY_", extra="ignore")

    database_url: str = "sqlite:///./priorly.db"
    env: Literal["dev", "test", "prod"] = "dev"
    secret_key: SecretStr = SecretStr(PLACEHOLDER_SECRET)
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    demo_dataset: Path = REPO_ROOT / "datasets" / "ces"
    # Job queue (app/jobs): Redis when set (several machines), else a SQLite file.
    redis_url: str | None = None
    queue_path: Path | None = None
    job_stale_after_s: float = Field(default=60.0, gt=0)
    # Request-body limits (app/limits.py): 413 before the body is read.
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    max_upload_bytes: int = Field(default=55 * 1024 * 1024, ge=1024)
    # Rate limits (app/ratelimit.py).
    login_max_failures_per_account: int = Field(default=5, ge=0)
    login_max_failures_per_ip: int = Field(default=50, ge=0)
    login_lockout_s: float = Field(default=900.0, gt=0)
    api_rate_limit_per_minute: int = Field(default=6000, ge=0)
    session_rate_limit_per_minute: int = Field(default=600, ge=0)
    # Process resources: database pool (app/db.py), torch threads, garbage collector.
    db_pool_size: int = Field(default=8, ge=1)
    db_max_overflow: int = Field(default=8, ge=0)
    torch_threads: int = Field(default=1, ge=1)
    gc_freeze: bool = True
    respondent_start_rate_limit_per_minute: int = Field(default=30, ge=0)
    # Proxies whose X-Forwarded-For / X-Forwarded-Proto are believed (app/main.py).
    trusted_proxies: str = "127.0.0.1"
    # Origins whose pages may call /api/v1 from a browser (app/main.py, CORS).
    api_cors_origins: str = ""
    # The least severe log lines priorly serve / priorly worker write (app/logs.py).
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Answer steps reused across respondents (app/session/).
    step_memo_size: int = Field(default=2048, ge=0)
    # The largest persona dictionary of a study (app/services/personas.py).
    max_study_personas: int = Field(default=2000, ge=1)

    @field_validator("database_url")
    @classmethod
    def _url(cls, value: str) -> str:
        value = normalise_database_url(value)
        if not value.startswith(("sqlite", "postgresql")):
            raise ValueError(
                f"unsupported database URL {redact_url(value)!r} "
                "(use sqlite:/// or postgresql+psycopg://)"
            )
        return value

    @model_validator(mode="after")
    def _secret(self) -> Settings:
        secret = self.secret_key.get_secret_value()
        if self.env != "dev" and (secret in _PLACEHOLDERS or len(secret) < 32):
            raise ValueError(
                f"PRIORLY_SECRET_KEY must be set to a random string of at least 32 characters "
                f"when PRIORLY_ENV={self.env}"
            )
        return self

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    # The live loop (app/session/): session writes run at once per process (values below 1
    # count as 1); the answer call in the event loop on PostgreSQL (off: false) and its
    # two asyncio pools (answers; the API rate limiter's counter).
    session_concurrency: int = 4
    async_answers: bool = True
    async_pool_size: int = Field(default=4, ge=1)
    async_limiter_pool_size: int = Field(default=2, ge=1)

    # Language-model inference server (persona distributions, `personas generate --backend
    # openai` when --base-url / --model are not given): PRIORLY_LLM_BASE_URL, the server
    # root of an OpenAI-compatible server such as `priorly inference serve`
    # (http://127.0.0.1:8001); PRIORLY_LLM_MODEL, its served model name (unset: the
    # embedded SmolLM2-135M-Instruct); PRIORLY_LLM_API_KEY, sent as a bearer token.
    llm_base_url: str | None = None
    llm_model: str | None = None
    llm_api_key: SecretStr | None = None

    @field_validator("llm_base_url")
    @classmethod
    def _llm_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        return check_server_url(value)


def check_server_url(value: str) -> str:
    """An inference server's root URL, checked in full and without a trailing ``/``:
    ``http`` or ``https``, a host, a port in 1–65535 when given, and no path but an optional
    ``/v1`` (no query, no fragment).

    >>> check_server_url("http://127.0.0.1:8001/v1/")
    'http://127.0.0.1:8001/v1'
    >>> check_server_url("http://127.0.0.1:88211")
    Traceback (most recent call last):
    ValueError: 'http://127.0.0.1:88211': the port must be a number from 1 to 65535
    """
    url = value.strip().rstrip("/")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValueError(f"{url!r}: the port must be a number from 1 to 65535") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"not an http:// or https:// URL: {url!r}")
    if not parts.hostname:
        raise ValueError(f"{url!r} has no host")
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"{url!r}: the port must be a number from 1 to 65535")
    if parts.path not in ("", "/v1") or parts.query or parts.fragment:
        root = f"{parts.scheme}://{parts.netloc}"
        raise ValueError(
            f"{url!r} has the path {parts.path or ''}{'?' + parts.query if parts.query else ''}: "
            f"give the server root, e.g. {root} (optionally with /v1)"
        )
    return url


def load_settings(**overrides: object) -> Settings:
    """Build settings from the environment plus ``overrides``; one-line error if invalid."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        field = f"PRIORLY_{where.upper()}: " if where else ""
        msg = str(first.get("msg", exc)).removeprefix("Value error, ")
        raise ConfigurationError(f"invalid settings: {field}{msg}") from None


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings (cached; ``get_settings.cache_clear()`` in tests)."""
    return load_settings()
