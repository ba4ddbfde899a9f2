"""The database tables (SQLModel), owned by the Alembic migration chain in ``migrations/``.

Change a table here only together with a migration (``alembic revision --autogenerate``,
then read and fix it); CI runs ``alembic check``, which fails on any difference.

Conventions:

* Integer surrogate keys ``id``; every foreign key has an index and ``ON DELETE CASCADE``
  (deleting a study deletes everything under it), except ``job.study_id`` which becomes
  NULL (the job history stays).
* Status-like columns are short strings checked against their enum by a CHECK constraint.
* Timestamps are timezone-aware UTC.
* Option answers are stored as the codebook's option *letters* (stable when a study's
  items are re-ordered), never as indices.
* Constraint names follow :data:`NAMING_CONVENTION`, so migrations can refer to them on
  every backend (SQLite batch mode needs names).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    CheckConstraint,
    DateTime,
    Index,
    LargeBinary,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlmodel import Field, SQLModel

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
SQLModel.metadata.naming_convention = NAMING_CONVENTION

OPTION_MAX_LEN = 32
"""Longest option letter stored (the importer refuses longer ones)."""


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


def iso_utc(ts: datetime | None) -> str | None:
    """``ts`` as ISO 8601 in UTC with its offset, the same on every database
    (:func:`as_utc`).

    Always with microseconds, so that every time has one shape (a fixed-format parser
    reads them all). Example: ``iso_utc(datetime(2026, 12, 4, 18, 55, 27))`` is
    ``"2026-12-04T18:55:27.000000+00:00"``; ``iso_utc(None)`` is ``None``.
    """
    return None if ts is None else as_utc(ts).isoformat(timespec="microseconds")


def as_utc(ts: datetime) -> datetime:
    """``ts`` as a timezone-aware UTC time: SQLite returns a stored time without its zone,
    and a naive time here is always UTC (:func:`utcnow`)."""
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def _ts(nullable: bool = False) -> Any:
    """A timezone-aware timestamp column: ``now`` by default, or NULL when nullable."""
    if nullable:
        return Field(default=None, sa_type=DateTime(timezone=True), nullable=True)  # type: ignore[call-overload]
    return Field(default_factory=utcnow, sa_type=DateTime(timezone=True), nullable=False)  # type: ignore[call-overload]


def _in(column: str, values: type[StrEnum], nullable: bool = False) -> CheckConstraint:
    allowed = ", ".join(f"'{v.value}'" for v in values)
    expr = f"{column} IN ({allowed})"
    if nullable:
        expr = f"{column} IS NULL OR {expr}"
    return CheckConstraint(expr, name=f"{column}_valid")


class StudyStatus(StrEnum):
    draft = "draft"
    published = "published"
    closed = "closed"


class ItemRole(StrEnum):
    question = "question"  # askable
    attribute = "attribute"  # known about the respondent (demographics, region)
    target = "target"  # what the study wants to predict


class RespondentSource(StrEnum):
    import_ = "import"
    live = "live"


class Split(StrEnum):
    train = "train"
    val = "val"
    test = "test"


class SessionStatus(StrEnum):
    active = "active"
    completed = "completed"
    declined = "declined"
    abandoned = "abandoned"


class JobStatus(StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


class WorkerKind(StrEnum):
    serve = "serve"
    worker = "worker"


class Researcher(SQLModel, table=True):
    """A researcher account (owner of studies and API keys); ``is_admin`` sees every study.

    ``password_hash`` is NULL for an account that cannot log in to the admin UI yet (created
    by ``priorly user create`` without a password); the admin UI sets it (argon2 / bcrypt).
    ``email`` is stored lower-cased, so uniqueness is case-insensitive.
    """

    __tablename__ = "researcher"

    id: int | None = Field(default=None, primary_key=True)
    email: str = Field(max_length=320, unique=True)
    password_hash: str | None = Field(default=None, max_length=255)
    is_admin: bool = False
    is_active: bool = True
    created_at: datetime = _ts()


class ApiKey(SQLModel, table=True):
    """A researcher's API key for the JSON API.

    Only ``key_hash`` (SHA-256 hex of the whole key) is stored: the key itself is shown
    once at creation. ``prefix`` (the key's public first characters) identifies a key in
    listings without revealing it. A key with ``revoked_at`` set is refused. The keys are
    256-bit random strings, so a fast hash is enough (no brute force of the space is
    possible; a slow password hash would only slow every API call).
    """

    __tablename__ = "api_key"

    id: int | None = Field(default=None, primary_key=True)
    researcher_id: int = Field(foreign_key="researcher.id", ondelete="CASCADE", index=True)
    name: str = Field(default="", max_length=200)
    prefix: str = Field(max_length=32)
    key_hash: str = Field(max_length=128, unique=True)
    created_at: datetime = _ts()
    last_used_at: datetime | None = _ts(nullable=True)
    revoked_at: datetime | None = _ts(nullable=True)


class Study(SQLModel, table=True):
    """A survey / elicitation study.

    ``settings`` holds the validated :class:`app.schemas.StudySettings` (criterion,
    budgets, group protocol); ``benchmark_runs`` the dataset's runs
    (``[{"seed", "cand_qids", "eval_qids"}, ...]``) when it was imported with any.
    """

    __tablename__ = "study"
    __table_args__ = (_in("status", StudyStatus),)

    id: int | None = Field(default=None, primary_key=True)
    slug: str = Field(max_length=100, unique=True)
    name: str = Field(max_length=200)
    status: str = Field(default=StudyStatus.draft.value, max_length=16)
    description: str = Field(default="", sa_type=Text)
    consent_text: str = Field(default="", sa_type=Text)
    completion_code: str | None = Field(default=None, max_length=100)
    redirect_url: str | None = Field(default=None, max_length=2000)
    settings: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    benchmark_runs: list[dict[str, Any]] = Field(default_factory=list, sa_type=JSON)
    source: str | None = Field(default=None, sa_type=Text)
    license: str | None = Field(default=None, sa_type=Text)
    owner_id: int | None = Field(
        default=None, foreign_key="researcher.id", ondelete="SET NULL", index=True
    )
    created_at: datetime = _ts()


class Item(SQLModel, table=True):
    """One item of a study: ``options`` is ``[[letter, label], ...]`` in scale order."""

    __tablename__ = "item"
    __table_args__ = (UniqueConstraint("study_id", "key"), _in("role", ItemRole))

    id: int | None = Field(default=None, primary_key=True)
    study_id: int = Field(foreign_key="study.id", ondelete="CASCADE", index=True)
    key: str = Field(max_length=200)
    question: str = Field(sa_type=Text)
    options: list[list[str]] = Field(sa_type=JSON)
    role: str = Field(max_length=16)
    topic: str | None = Field(default=None, max_length=200)
    position: int = 0
    is_preference_criterion: bool = False


NEVER_REUSE_IDS: dict[str, Any] = {"sqlite_autoincrement": True}
"""Table options of the tables whose ids reach API clients (respondents, sessions): SQLite
never gives an erased row's id to a new one (PostgreSQL's sequences never do; migration
0014)."""


class Respondent(SQLModel, table=True):
    """A respondent: imported (historical data) or live (created by a session).

    ``attributes`` maps attribute-item keys to option letters (what is known about the
    respondent before any question). ``answers`` holds an imported respondent's historical
    answers to the other items, ``{item key: letter}`` (missing cells absent); a live
    respondent's answers are the ``answer`` rows of their sessions, and ``answers`` stays
    empty. Item keys are immutable within a study, so the keys stay valid.

    Why JSON and not one row per answer: an import writes ~200k answers for a 5k-respondent
    survey; as rows with two foreign keys that took 10-30 s on PostgreSQL (per-row FK
    trigger checks), as one JSON document per respondent it takes well under a second, and
    a model fit reads the whole matrix anyway.

    ``panel_params`` holds per-respondent panel data (e.g. a recruitment panel's URL
    parameters). ``earlier_starts`` counts the respondents the same browser had started in
    this study before this one (0: a first start; more: a repeated start to check).
    """

    __tablename__ = "respondent"
    __table_args__ = (
        UniqueConstraint("study_id", "external_id"),
        _in("source", RespondentSource),
        _in("split", Split, nullable=True),
        NEVER_REUSE_IDS,
    )

    id: int | None = Field(default=None, primary_key=True)
    study_id: int = Field(foreign_key="study.id", ondelete="CASCADE", index=True)
    external_id: str | None = Field(default=None, max_length=200)
    attributes: dict[str, str] = Field(default_factory=dict, sa_type=JSON)
    answers: dict[str, str] = Field(default_factory=dict, sa_type=JSON)
    panel_params: dict[str, Any] | None = Field(default=None, sa_type=JSON(none_as_null=True))
    source: str = Field(default=RespondentSource.live.value, max_length=16)
    split: str | None = Field(default=None, max_length=8)
    earlier_starts: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    created_at: datetime = _ts()


def respondent_label(external_id: str | None, respondent_id: int | None) -> str:
    """The respondent id of the exports and the API: the external id, else ``r<id>``."""
    return external_id or f"r{respondent_id}"


def external_id_problem(external_id: str) -> str | None:
    """Why ``external_id`` cannot be a respondent's external id, or ``None``: spaces at
    either end (a spreadsheet or a stats package trims them, and the id no longer
    matches), or the form ``r<number>`` that :func:`respondent_label` gives respondents
    without one (two respondents would share an id in the exports).

    Example: ``external_id_problem("r5373")`` is ``"'r5373' has the form r<number> of
    the ids given to respondents without an external id"``; ``"R_5373"`` is fine.
    """
    if external_id != external_id.strip():
        return f"{external_id!r} begins or ends with a space"
    if re.fullmatch(r"r[0-9]+", external_id):
        return (
            f"{external_id!r} has the form r<number> of the ids given to respondents "
            "without an external id"
        )
    return None


IMPORTED_ID_PREFIX = "import-"


def imported_external_id(raw: str) -> str:
    """The external id an imported respondent is stored with: ``raw``, or
    ``import-<raw>`` when ``raw`` has the form ``r<number>`` that :func:`respondent_label`
    gives live respondents without an external id (``r5468`` could otherwise name an
    imported respondent and, once the study has that many, a live one in the exports).

    >>> imported_external_id("r5468"), imported_external_id("R_12"), imported_external_id("17")
    ('import-r5468', 'R_12', '17')
    """
    return IMPORTED_ID_PREFIX + raw if re.fullmatch(r"r[0-9]+", raw) else raw


class ElicitationSession(SQLModel, table=True):
    """One respondent's run through a study.

    ``state`` caches the serialised belief state after ``state_version`` answers; it must
    always equal the replay of the stored answers. ``is_preview`` marks a researcher's
    "preview as respondent" run: dashboards and exports leave it out. ``asked_attributes``
    says whether the session asked the study's attribute questions (the browser flow): an
    attribute its respondent has no answer to was declined only then (``None``: a session
    stored before this was recorded; the study's ``ask_attributes`` setting decides).

    ``completion_code`` is written when the session completes, in the completing write:
    the study's fixed completion code at that moment (the code the respondent is shown,
    however the study's code changes later), ``""`` when the study had none (the session's
    derived code is shown), ``None`` while the session is not completed and for a session
    completed before the column was written (the code is computed from the study as it is
    now). :func:`app.session.tokens.session_completion_code` reads it.
    """

    __tablename__ = "elicitation_session"
    __table_args__ = (_in("status", SessionStatus), NEVER_REUSE_IDS)

    id: int | None = Field(default=None, primary_key=True)
    study_id: int = Field(foreign_key="study.id", ondelete="CASCADE", index=True)
    respondent_id: int = Field(foreign_key="respondent.id", ondelete="CASCADE", index=True)
    token_hash: str = Field(max_length=128, unique=True)
    status: str = Field(default=SessionStatus.active.value, max_length=16)
    state: bytes | None = Field(default=None, sa_type=LargeBinary)
    state_version: int = 0
    created_at: datetime = _ts()
    updated_at: datetime = _ts()
    completed_at: datetime | None = _ts(nullable=True)
    is_preview: bool = Field(default=False, sa_column_kwargs={"server_default": false()})
    asked_attributes: bool | None = None
    completion_code: str | None = Field(default=None, max_length=100)
    model_id: int | None = None
    """The fitted model whose states this session stores (set with its first decision;
    ``None`` before it). A session keeps it when another model is promoted. No foreign
    key: if the row is gone the session is replayed with the study's active model."""


class Answer(SQLModel, table=True):
    """An answer given in a session; ``option`` is ``NULL`` for a skipped item."""

    __tablename__ = "answer"
    __table_args__ = (
        UniqueConstraint("session_id", "item_id"),
        UniqueConstraint("session_id", "idempotency_key"),
    )

    id: int | None = Field(default=None, primary_key=True)
    session_id: int = Field(foreign_key="elicitation_session.id", ondelete="CASCADE", index=True)
    item_id: int = Field(foreign_key="item.id", ondelete="CASCADE", index=True)
    option: str | None = Field(default=None, max_length=OPTION_MAX_LEN)
    idempotency_key: str | None = Field(default=None, max_length=128)
    created_at: datetime = _ts()


class SelectionDecision(SQLModel, table=True):
    """Why item ``position`` of a session was chosen (``item_id`` NULL when it stopped)."""

    __tablename__ = "selection_decision"
    __table_args__ = (UniqueConstraint("session_id", "position"),)

    id: int | None = Field(default=None, primary_key=True)
    session_id: int = Field(foreign_key="elicitation_session.id", ondelete="CASCADE", index=True)
    position: int
    item_id: int | None = Field(default=None, foreign_key="item.id", ondelete="CASCADE", index=True)
    criterion: str = Field(max_length=64)
    scores: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    stop_reason: str | None = Field(default=None, max_length=200)
    created_at: datetime = _ts()


class ErasureRecord(SQLModel, table=True):
    """What remains of an erased respondent: counts only, no answer, attribute or id.

    Written by the erasure of a live respondent (``DELETE /api/v1/sessions/{id}``), so a
    study's aggregate figures (respondents started / completed, answers collected) can
    still account for people whose data was removed.
    """

    __tablename__ = "erasure_record"

    id: int | None = Field(default=None, primary_key=True)
    study_id: int = Field(foreign_key="study.id", ondelete="CASCADE", index=True)
    n_sessions: int = 0
    n_completed: int = 0
    n_answers: int = 0
    created_at: datetime = _ts()


class ModelStatus(StrEnum):
    promoted = "promoted"
    rejected = "rejected"


class FittedModel(SQLModel, table=True):
    """A fitted belief model (``models.base.BeliefModel.to_bytes``) of a study.

    A version of the study's model (:mod:`app.services.learning`): ``status`` says whether
    the fit was promoted to the active model or rejected (``NULL`` for models stored
    outside the learning loop: GNNs, older rows), ``reason`` why; ``val_log_lik`` is its
    mean log-likelihood per held-out respondent of the observed answers, and
    ``active_val_log_lik`` the score of the model that was active when it was judged
    (``NULL`` without one); ``n_imported`` / ``n_live`` count its training respondents and
    ``n_validation`` the held-out ones.
    """

    __tablename__ = "fitted_model"

    id: int | None = Field(default=None, primary_key=True)
    study_id: int = Field(foreign_key="study.id", ondelete="CASCADE", index=True)
    family: str = Field(max_length=64)
    blob: bytes = Field(sa_type=LargeBinary)
    training_hash: str = Field(max_length=128)
    metrics: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    is_active: bool = False
    created_at: datetime = _ts()
    status: str | None = Field(default=None, max_length=16)
    reason: str | None = Field(default=None, max_length=500)
    val_log_lik: float | None = None
    active_val_log_lik: float | None = None
    n_imported: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    n_live: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    n_validation: int = Field(default=0, sa_column_kwargs={"server_default": "0"})


ACTIVE_FIT_WHERE = "kind = 'fit_model' AND status IN ('queued', 'running')"
"""The rows of :class:`Job` that the index ``uq_job_one_active_fit`` keeps unique per study."""


class Job(SQLModel, table=True):
    """A long-running task (fit, persona generation, GNN training, simulation, ...)."""

    __tablename__ = "job"
    __table_args__ = (
        _in("status", JobStatus),
        # one queued or running fit per study (migration 0012)
        Index(
            "uq_job_one_active_fit",
            "study_id",
            unique=True,
            sqlite_where=text(ACTIVE_FIT_WHERE),
            postgresql_where=text(ACTIVE_FIT_WHERE),
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    kind: str = Field(max_length=64)
    study_id: int | None = Field(
        default=None, foreign_key="study.id", ondelete="SET NULL", index=True
    )
    status: str = Field(default=JobStatus.queued.value, max_length=16, index=True)
    progress: float = 0.0
    message: str = Field(default="", sa_type=Text)
    error: str | None = Field(default=None, sa_type=Text)
    payload: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    result: dict[str, Any] | None = Field(default=None, sa_type=JSON(none_as_null=True))
    attempts: int = 0
    created_at: datetime = _ts()
    started_at: datetime | None = _ts(nullable=True)
    finished_at: datetime | None = _ts(nullable=True)
    # The queue worker holding a running job (``host:pid``) and its last sign of life: a job
    # whose worker died is found by a dead pid (same host) or a stale heartbeat and retried.
    worker: str | None = Field(default=None, max_length=200)
    heartbeat_at: datetime | None = _ts(nullable=True)
    cancel_requested: bool = False
    created_by_id: int | None = Field(
        default=None, foreign_key="researcher.id", ondelete="SET NULL", index=True
    )


class StudyShare(SQLModel, table=True):
    """A study shared by its owner with another researcher (who may see and edit it)."""

    __tablename__ = "study_share"
    __table_args__ = (UniqueConstraint("study_id", "researcher_id"),)

    id: int | None = Field(default=None, primary_key=True)
    study_id: int = Field(foreign_key="study.id", ondelete="CASCADE", index=True)
    researcher_id: int = Field(foreign_key="researcher.id", ondelete="CASCADE", index=True)
    created_at: datetime = _ts()


class Invitation(SQLModel, table=True):
    """An invitation to create a researcher account (the link's token is stored hashed).

    Used once (``used_at``); refused after ``expires_at``.
    """

    __tablename__ = "invitation"

    id: int | None = Field(default=None, primary_key=True)
    email: str = Field(max_length=320)
    token_hash: str = Field(max_length=128, unique=True)
    is_admin: bool = False
    invited_by_id: int | None = Field(
        default=None, foreign_key="researcher.id", ondelete="SET NULL", index=True
    )
    created_at: datetime = _ts()
    expires_at: datetime = Field(sa_type=DateTime(timezone=True), nullable=False)  # type: ignore[call-overload]
    used_at: datetime | None = _ts(nullable=True)


class PersonaDistribution(SQLModel, table=True):
    """A language model's answer distribution for one persona × item pair.

    Content-addressed and shared by every study: the key is the model, the prompt
    template's ``version_id`` and the SHA-256 hashes of the persona text and of the item's
    wording (question + option labels), so a generation run never recomputes a stored
    pair. ``probs`` has one probability per option (letters A, B, ... in order);
    ``valid_mass`` is the next-token mass on valid letters and ``flagged`` marks a pair
    whose mass was below the run's threshold.
    """

    __tablename__ = "persona_distribution"
    __table_args__ = (
        # Explicit name: the convention's would exceed PostgreSQL's 63-character limit.
        UniqueConstraint(
            "model_id",
            "template_version",
            "persona_hash",
            "item_hash",
            name="uq_persona_distribution_key",
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    model_id: str = Field(max_length=200)
    template_version: str = Field(max_length=64)
    persona_hash: str = Field(max_length=64, index=True)
    item_hash: str = Field(max_length=64)
    probs: list[float] = Field(sa_type=JSON)
    valid_mass: float
    flagged: bool = False
    created_at: datetime = _ts()


class StudyPersona(SQLModel, table=True):
    """A persona of a study's dictionary; ``text`` is stored verbatim (escape when shown)."""

    __tablename__ = "study_persona"
    __table_args__ = (UniqueConstraint("study_id", "text_hash"),)

    id: int | None = Field(default=None, primary_key=True)
    study_id: int = Field(foreign_key="study.id", ondelete="CASCADE", index=True)
    key: str = Field(max_length=200)
    text: str = Field(sa_type=Text)
    text_hash: str = Field(max_length=64)
    weight: float = 1.0
    source: str = Field(max_length=32)
    # {attribute item key: option letter} of a persona built from an attribute profile or
    # an imported respondent (empty for a researcher's free text): the persona prior's
    # distribution for those attribute items (app.services.belief.persona_prior_model).
    attributes: dict[str, str] = Field(default_factory=dict, sa_type=JSON)
    created_at: datetime = _ts()


class GroupRoundStatus(StrEnum):
    open = "open"
    closed = "closed"


class GroupRoundOutcome(StrEnum):
    answered = "answered"
    skipped = "skipped"  # "prefer not to answer"
    no_answer = "no_answer"  # the round closed before the member answered


class GroupRound(SQLModel, table=True):
    """One round of a group study: one question put to a chosen subset of the panel.

    Opened from a ``plan_group_round`` job (``plan_job_id``; ``plan`` keeps the plan's
    question scores and the members' expected gains, for audit), closed by the researcher.
    ``panel`` is ``live`` or ``import`` (which respondents the group is made of; every
    round of a study uses the panel of its first round). ``number`` counts from 1.
    """

    __tablename__ = "group_round"
    __table_args__ = (
        UniqueConstraint("study_id", "number"),
        _in("status", GroupRoundStatus),
        _in("panel", RespondentSource),
    )

    id: int | None = Field(default=None, primary_key=True)
    study_id: int = Field(foreign_key="study.id", ondelete="CASCADE", index=True)
    number: int
    status: str = Field(default=GroupRoundStatus.open.value, max_length=16)
    item_id: int = Field(foreign_key="item.id", ondelete="CASCADE", index=True)
    panel: str = Field(max_length=16)
    plan_job_id: int | None = Field(
        default=None, foreign_key="job.id", ondelete="SET NULL", index=True
    )
    plan: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    opened_by_id: int | None = Field(
        default=None, foreign_key="researcher.id", ondelete="SET NULL", index=True
    )
    opened_at: datetime = _ts()
    closed_at: datetime | None = _ts(nullable=True)


class GroupRoundMember(SQLModel, table=True):
    """A respondent asked in a round, with their personal link and (after close) outcome.

    The link's token is stored only as its SHA-256 hash (``token_hash``). The answer itself
    is an ``answer`` row of the member's round session (``session_id``, one session per
    member and round, created when the round opens, whose only question is the round's);
    ``outcome`` is written when the round closes.
    """

    __tablename__ = "group_round_member"
    __table_args__ = (
        UniqueConstraint("round_id", "respondent_id"),
        _in("outcome", GroupRoundOutcome, nullable=True),
    )

    id: int | None = Field(default=None, primary_key=True)
    round_id: int = Field(foreign_key="group_round.id", ondelete="CASCADE", index=True)
    respondent_id: int = Field(foreign_key="respondent.id", ondelete="CASCADE", index=True)
    session_id: int = Field(
        foreign_key="elicitation_session.id", ondelete="CASCADE", index=True, unique=True
    )
    token_hash: str = Field(max_length=128, unique=True)
    expected_gain: float = 0.0
    outcome: str | None = Field(default=None, max_length=16)


class RateLimitCounter(SQLModel, table=True):
    """A fixed-window counter of the rate limiter (``app/ratelimit.py``).

    Kept in the database (not in process memory) so every worker process and machine
    counts the same failed logins and API calls. ``key`` names what is counted (e.g.
    ``login-account:<sha256 of the email>``, ``api:<sha256 of the credential>``; never a
    secret in clear); the window ends at ``expires_at`` (UNIX seconds), after which the next
    hit starts a new window at 1.
    """

    __tablename__ = "rate_limit_counter"

    key: str = Field(primary_key=True, max_length=200)
    count: int = 0
    expires_at: float = Field(index=True)


class WorkerHeartbeat(SQLModel, table=True):
    """A job worker's last sign of life (written by :mod:`app.jobs.heartbeat`).

    One row per consumer process: ``id`` is its ``host:pid`` (``priorly worker``, or
    ``priorly serve`` with its in-process worker: ``kind``), ``started_at`` when it began
    to consume the queue, ``last_seen`` rewritten every
    :data:`app.jobs.heartbeat.HEARTBEAT_S` seconds while it runs. A worker counts as
    running while ``last_seen`` is at most :data:`app.jobs.heartbeat.SEEN_WITHIN_S` old;
    rows older than :data:`app.jobs.heartbeat.PRUNE_AFTER_S` are deleted by the next
    heartbeat of any worker.
    """

    __tablename__ = "worker_heartbeat"
    __table_args__ = (_in("kind", WorkerKind),)

    id: str = Field(primary_key=True, max_length=200)
    kind: str = Field(max_length=16)
    started_at: datetime = _ts()
    last_seen: datetime = Field(  # type: ignore[call-overload]
        default_factory=utcnow, sa_type=DateTime(timezone=True), nullable=False, index=True
    )


__all__ = [
    "Answer",
    "ApiKey",
    "ElicitationSession",
    "ErasureRecord",
    "FittedModel",
    "GroupRound",
    "GroupRoundMember",
    "GroupRoundOutcome",
    "GroupRoundStatus",
    "Invitation",
    "Item",
    "ItemRole",
    "Job",
    "JobStatus",
    "NAMING_CONVENTION",
    "PersonaDistribution",
    "RateLimitCounter",
    "Respondent",
    "Researcher",
    "RespondentSource",
    "SelectionDecision",
    "SessionStatus",
    "Split",
    "Study",
    "StudyPersona",
    "StudyShare",
    "StudyStatus",
    "WorkerHeartbeat",
    "WorkerKind",
    "utcnow",
]


class AdminSession(SQLModel, table=True):
    """A login to the admin UI (``app/auth.py``): the session cookie holds a random token,
    only its SHA-256 hex is stored here.

    Logging out deletes the row, so the cookie stops working at once; changing the
    password or deactivating the account deletes every row of the researcher (as does
    removing the researcher: ``ON DELETE CASCADE``). ``csrf_token`` is the CSRF token of
    this login (forms and htmx send it back); the row is refused after ``expires_at``.
    """

    __tablename__ = "admin_session"

    id: int | None = Field(default=None, primary_key=True)
    token_hash: str = Field(max_length=64, unique=True)
    researcher_id: int = Field(foreign_key="researcher.id", ondelete="CASCADE", index=True)
    csrf_token: str = Field(max_length=64)
    created_at: datetime = _ts()
    expires_at: datetime = Field(sa_type=DateTime(timezone=True), nullable=False, index=True)  # type: ignore[call-overload]
