"""The JSON API under ``/api/v1``: adaptive sessions for other products.

Authentication (``Authorization: Bearer <credential>``):

* a researcher's **API key** (``pk_...``) creates sessions in the researcher's own studies
  (any study for an admin) and may read or erase any session of those studies;
* a session's **token** (returned once when the session is created) lets the respondent's
  client read its own session, answer, read predictions and explanations, and erase it.

Another owner's study or session is answered with 404 (never 403 or 200), so a key cannot
learn which studies exist. Every error is JSON ``{"code": "...", "message": "..."}`` with a
stable ``code`` (see :data:`ERROR_CODES`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError as SAOperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from app import ratelimit
from app import session as svc
from app.auth import can_see_study
from app.deps import EngineDep, SessionDep, plain_number
from app.errors import (
    ConfigurationError,
    ConflictError,
    DatabaseError,
    InvalidInputError,
    NotFoundError,
    PriorlyError,
    validation_message,
)
from app.services import respondents
from app.services.apikeys import (
    KEY_PREFIX,
    AuthenticationError,
    authenticate_api_key,
)
from app.services.predictions import NOT_ASKED
from app.services.profile import session_predictions, session_profile
from app.services.studies import get_study_by_slug
from app.session import async_path as answer_async
from app.tables import ElicitationSession, Researcher, Study, external_id_problem
from app.textguard import clip

# ----- errors ------------------------------------------------------------------------------

ERROR_CODES: dict[str, str] = {
    "unauthenticated": "401: missing, unknown or revoked API key or session token",
    "study_not_found": "404: no such study, or not one of your studies",
    "session_not_found": "404: no such session, or not yours",
    "item_not_found": "404: the item is not an item of the study",
    "not_found": "404: no such resource",
    "method_not_allowed": "405: the path has no call with this method (see Allow)",
    "invalid_input": "422: the request body or parameters are invalid",
    "invalid_answer": "422: the option is not an option of the item, or skipping is not allowed",
    "invalid_attributes": "422: an unknown attribute or option",
    "answer_conflict": "409: the item was already answered differently, or the "
    "idempotency key was used for another answer",
    "not_current_question": "409: the item is not the question the session is waiting for",
    "session_closed": "409: the session is completed",
    "study_not_open": "409: the study is not open for responses",
    "external_id_taken": "409: a respondent with this external id exists in the study",
    "no_model": "409: the study has no fitted belief model (and no data to fit one)",
    "model_preparing": "409: the study's first model is being fitted by a job: retry later",
    "model_fit_failed": "409: the study has no model and its last fit failed: a researcher "
    "must fix the study and refit (retrying does not help)",
    "study_misconfigured": "409: the study's settings cannot run a session",
    "database_unavailable": "503: the database is unreachable, not migrated, or overloaded "
    "(no free connection, too many clients): send the same request again shortly",
    "payload_too_large": "413: the request body is larger than the limit (app/limits.py)",
    "rate_limited": "429: too many calls per minute with this credential (see Retry-After)",
    "conflict": "409: the request conflicts with stored data (another kind than the above)",
    "http_error": "4xx: a request the web server refused before the API saw it",
    "configuration_error": "500: the server's settings are unusable (an operator must fix them)",
    "error": "400: any other refused request (the message says why)",
}


def _db_unavailable_errors() -> tuple[type[BaseException], ...]:
    """Driver and SQLAlchemy errors that mean "the database cannot serve now" (503): a
    refused or dropped connection, a locked SQLite file. The answer path's raw DB-API
    statements raise the drivers' own classes, the ORM SQLAlchemy's."""
    errors: list[type[BaseException]] = [SAOperationalError, sqlite3.OperationalError]
    try:
        import psycopg  # optional: the postgres extra

        errors.append(psycopg.OperationalError)
    except ImportError:  # pragma: no cover (psycopg is a dependency)
        pass
    return tuple(errors)


DB_UNAVAILABLE = _db_unavailable_errors()


def _code_of(exc: PriorlyError) -> str:
    code = getattr(exc, "code", None)
    if isinstance(code, str):
        return code
    for cls, name in (
        (NotFoundError, "not_found"),
        (InvalidInputError, "invalid_input"),
        (ConflictError, "conflict"),
        (DatabaseError, "database_unavailable"),
        (ConfigurationError, "configuration_error"),
    ):
        if isinstance(exc, cls):
            return name
    return "error"


def error_response(
    status: int, code: str, message: str, retry_after: int | None = None
) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    body = {"code": code, "message": clip(message)}  # never a huge input echoed in full
    return JSONResponse(body, status_code=status, headers=headers or None)


class ApiRoute(APIRoute):
    """A route whose errors are JSON ``{"code", "message"}`` (this router's contract)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except PriorlyError as exc:
                retry_after = getattr(exc, "retry_after", None)  # e.g. model_preparing
                return error_response(exc.http_status, _code_of(exc), exc.message, retry_after)
            except RequestValidationError as exc:
                return error_response(422, "invalid_input", validation_message(exc))
            except StarletteHTTPException as exc:
                if exc.status_code == 400:  # FastAPI could not parse the body (not JSON/UTF-8)
                    return error_response(422, "invalid_input", f"request body: {exc.detail}")
                code = "not_found" if exc.status_code == 404 else "http_error"
                return error_response(exc.status_code, code, str(exc.detail))
            except PoolTimeoutError:
                # every pooled connection stayed busy for the pool timeout: overload, not
                # a bug; the client may retry (the answer call is idempotent)
                return error_response(
                    503, "database_unavailable", "the server is overloaded; retry shortly"
                )
            except DB_UNAVAILABLE as exc:
                # the database refused or dropped the connection (e.g. PostgreSQL "too many
                # clients", a restart) or stayed locked: transient, retryable
                return error_response(
                    503,
                    "database_unavailable",
                    f"the database is unavailable ({type(exc).__name__}); retry shortly",
                )

        return route


class ApiOut(BaseModel):
    """A reply's schema: every field is listed as required in the OpenAPI document, since
    every reply has it (a field with a default is still always sent, null or not), so a
    generated client does not make it optional."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=True)


class ErrorOut(ApiOut):
    code: str = Field(examples=["answer_conflict"], json_schema_extra={"enum": sorted(ERROR_CODES)})
    message: str = Field(examples=["item '330a' was already answered in this session (A)"])


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "missing or invalid credentials"},
    404: {"model": ErrorOut, "description": "not found, or not yours"},
    405: {"model": ErrorOut, "description": "the path has no call with this method (see Allow)"},
    409: {"model": ErrorOut, "description": "conflict"},
    422: {"model": ErrorOut, "description": "invalid input"},
    413: {"model": ErrorOut, "description": "request body larger than the limit"},
    429: {"model": ErrorOut, "description": "rate limited: retry after Retry-After seconds"},
    503: {"model": ErrorOut, "description": "database unavailable or overloaded; retry"},
}

router = APIRouter(prefix="/api/v1", tags=["sessions"], route_class=ApiRoute, responses=_ERRORS)


# ----- schemas ------------------------------------------------------------------------------


class OptionOut(ApiOut):
    letter: str = Field(examples=["A"])
    label: str = Field(examples=["Support"])


class QuestionOut(ApiOut):
    item: str = Field(description="the item key", examples=["330a"])
    text: str = Field(examples=["Do you support or oppose ...?"])
    options: list[OptionOut]
    number: int = Field(description="1-based number of this question in the session")
    topic: str | None = None


class SessionOut(ApiOut):
    """Where a session stands: the question waiting for an answer, or completion."""

    session_id: int
    status: str = Field(
        examples=["active"],
        description="active, completed, or abandoned (a group round closed before this "
        "member answered: no more answers)",
    )
    phase: str = Field(examples=["question"], description="question or done")
    questions_answered: int = Field(description="questions answered or skipped so far")
    max_questions: int = Field(description="the most questions (it may stop earlier)")
    allow_skip: bool = Field(description="whether option null (prefer not to answer) is allowed")
    question: QuestionOut | None = Field(description="the next question; null when done")
    stop_reason: str | None = Field(default=None, examples=[None])


class AnswerReplyOut(SessionOut):
    """The reply of an answer: where the session stands after it, and whether it is a replay."""

    replayed: bool = Field(
        description="true when this answer was already stored (a retry with the same "
        "idempotency_key, or the same option to the same item sent again) and this is the "
        "reply it got then, replayed (the response then has the header "
        "Idempotent-Replayed: true); false when this request stored the answer"
    )


REPLAYED_HEADER = "Idempotent-Replayed"
"""The response header of a replayed answer (value ``true``; absent on a fresh answer)."""


class SessionCreated(SessionOut):
    token: str = Field(
        description="the session token (shown once): send it as 'Authorization: Bearer ...' "
        "for this session's calls"
    )
    respondent_id: int
    resume_url: str = Field(description="the browser link that resumes this session")


class AnswerOut(ApiOut):
    item: str
    option: str | None
    answered_at: str


class SessionDetail(SessionOut):
    study: str
    answers: list[AnswerOut]


class CreateSessionIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"external_id": "user-123", "attributes": {"gender": "A", "region": "C"}}]
        },
    )

    external_id: str | None = Field(
        default=None, min_length=1, max_length=200, description="your id for the respondent"
    )
    attributes: dict[str, str] = Field(
        default_factory=dict,
        description="known attributes: {attribute item key: option letter}",
    )


class AnswerIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"item": "330a", "option": "A", "idempotency_key": "6f1c2a9e-answer-1"},
                {"item": "330a", "option": None, "idempotency_key": "6f1c2a9e-skip-1"},
            ]
        },
    )

    item: str = Field(min_length=1, max_length=200, description="the current question's key")
    option: str | None = Field(
        max_length=32, description="the option letter, or null for 'prefer not to answer'"
    )
    idempotency_key: str = Field(
        min_length=1,
        max_length=128,
        description="unique per answer; a retry with the same key returns the same result",
    )


class PredictionOut(ApiOut):
    item: str
    role: str = Field(examples=["target"])
    question: str
    status: str = Field(
        examples=["not asked"],
        description="`answered`, `skipped` or `not asked`; an answered item's "
        "`distribution` is still the model's posterior predictive (the answer itself is "
        "in the session's answers)",
    )
    distribution: dict[str, float] = Field(examples=[{"A": 0.72, "B": 0.28}])


class PersonaOut(ApiOut):
    persona: int = Field(description="the persona's index in the model (from 0)")
    label: str = Field(
        description="its name: a persona dictionary's label, else 'class N' with N = "
        "persona + 1 (as the admin dashboard names it)"
    )
    weight: float = Field(description="posterior weight")


class PredictedAnswerOut(ApiOut):
    item: str = Field(examples=["330a"])
    role: str = Field(examples=["target"], description="question, target or attribute")
    question: str
    status: str = Field(
        examples=["not asked"], description="not asked, or skipped (asked, not answered)"
    )
    predicted: str = Field(description="the most probable option's letter")
    label: str = Field(description="the most probable option's label")
    probability: float = Field(description="the most probable option's probability")
    distribution: dict[str, float] = Field(examples=[{"A": 0.72, "B": 0.28}])


class PredictionsOut(ApiOut):
    answers: int = Field(
        description="the respondent's answer rows (skips included); the predictions are "
        "also conditioned on the attributes they gave, which are not counted here"
    )
    items: list[PredictionOut] = Field(description="every question not asked yet")
    targets: list[PredictionOut] = Field(description="every target item")
    personas: list[PersonaOut] = Field(description="top personas by posterior weight")
    predicted: list[PredictedAnswerOut] = Field(
        default_factory=list,
        description="every item the respondent has not answered (questions, targets and "
        "attributes, never asked or skipped), in study order, with the most probable option",
    )
    model_id: int | None = Field(
        default=None,
        description="the fitted model of these predictions: while the session is in "
        "progress, the one it uses; once finished, the study's active model",
    )


class ProfileOut(ApiOut):
    """A session's preference profile; ``model_notice`` (a string) is added when the model
    is a fallback prior (e.g. a persona prior before any history)."""

    model_config = ConfigDict(extra="allow", json_schema_serialization_defaults_required=True)

    session_id: int
    answers: int
    model_family: str
    criteria: list[dict[str, Any]] = Field(description="preference criteria, ranked")
    items: list[dict[str, Any]] = Field(description="every item of the model, ranked")
    summary: str
    predicted: list[PredictedAnswerOut] = Field(
        default_factory=list,
        description="every item the respondent has not answered, in study order (as in "
        "the predictions)",
    )


class ExplanationOut(ApiOut):
    model_config = ConfigDict(extra="allow", json_schema_serialization_defaults_required=True)

    position: int = Field(description="questions posed before this choice")
    item: str | None = Field(description="the chosen item, or null when the session stopped")
    stop_reason: str | None
    criterion: str = Field(examples=["eig"])
    scores: dict[str, float] = Field(
        description="each candidate's score (higher = better), best first",
        examples=[{"331a": 0.041, "334c": 0.032}],
    )
    target_entropy: float | None = None
    expected_target_entropy: float | None = None
    best_gain: float | None = None


class ErasedOut(ApiOut):
    erased: bool = True
    respondent_id: int
    sessions: int
    answers: int


# ----- dependencies -------------------------------------------------------------------------


def release(session: Session) -> None:
    """Give the request's connection back to the pool before a service opens its own.

    The authorization dependencies read with the request session; the write services run in
    their own locked transaction. Holding both connections at once would let a burst of
    requests take every pooled connection and then wait for a second one forever (pool
    exhaustion). ``close`` keeps the loaded objects usable (detached, not expired).
    """
    session.close()


def _bearer(authorization: str | None) -> str:
    if not authorization:
        raise AuthenticationError("missing 'Authorization: Bearer <API key or session token>'")
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise AuthenticationError("the Authorization header must be 'Bearer <credential>'")
    return value.strip()


SessionIdPath = Annotated[
    int,
    BeforeValidator(plain_number),
    Path(ge=1, le=2**31 - 1, description="the session's id (a positive 32-bit integer)"),
]
"""A session id in a path. Ids are 32-bit INTEGER columns (PostgreSQL): a larger number is
answered 422 here instead of overflowing in the database (a 500 found by fuzzing)."""

AuthHeader = Annotated[
    str | None,
    Header(
        description="Bearer <API key> or Bearer <session token>",
        alias="Authorization",
        include_in_schema=False,  # declared once as the security scheme (app/routes/api_docs.py)
    ),
]


def get_api_researcher(session: SessionDep, authorization: AuthHeader = None) -> Researcher:
    """The researcher of a valid API key (401 otherwise)."""
    credential = _bearer(authorization)
    if not credential.startswith(KEY_PREFIX):
        raise AuthenticationError("this call needs a researcher's API key")
    try:
        return authenticate_api_key(credential, session=session)
    finally:
        release(session)


def get_owned_study(slug: str, researcher: ApiResearcher, session: SessionDep) -> Study:
    """The study ``slug`` if the key's researcher may use it (owner, shared with them, or
    admin: :func:`app.auth.can_see_study`, the admin UI's rule); 404 for anything else."""
    try:
        study = get_study_by_slug(slug, session=session)
        allowed = can_see_study(researcher, study, session=session)
    except NotFoundError:
        study, allowed = None, False
    finally:
        release(session)
    if study is None or not allowed:
        raise svc.StudyNotFoundError(f"no study {slug!r} among your studies")
    return study


def get_authorized_session(
    session_id: SessionIdPath, session: SessionDep, authorization: AuthHeader = None
) -> tuple[ElicitationSession, Study]:
    """The session ``session_id`` for its own token, or for an API key of its study's owner."""
    try:
        return _authorized_session(session_id, session, authorization)
    finally:
        release(session)


def _authorized_session(
    session_id: int, session: Session, authorization: str | None
) -> tuple[ElicitationSession, Study]:
    credential = _bearer(authorization)
    not_found = svc.SessionNotFoundError(f"no session {session_id}")
    if credential.startswith(KEY_PREFIX):
        researcher = authenticate_api_key(credential, session=session)
        sess = session.get(ElicitationSession, session_id)
        study = session.get(Study, sess.study_id) if sess is not None else None
        if sess is None or study is None or not can_see_study(researcher, study, session=session):
            raise not_found
        return sess, study
    try:
        sess = svc.get_session_by_token(credential, session=session)
    except svc.SessionNotFoundError:
        raise AuthenticationError("unknown session token") from None
    if sess.id != session_id:
        raise not_found
    study = session.get(Study, sess.study_id)
    if study is None:
        raise not_found
    return sess, study


def get_answer_target(
    session_id: SessionIdPath, engine: EngineDep, authorization: AuthHeader = None
) -> svc.SessionSnapshot:
    """The answer call's authorization, read together with the session's state.

    Same rules as :func:`get_authorized_session`. A session token (the respondent's
    client: the hot path) costs one statement that returns the session row, its cached
    state and its study's head, which the answer path then uses as its (unlocked) read;
    an API key goes through the general check first.
    """
    credential = _bearer(authorization)
    not_found = svc.SessionNotFoundError(f"no session {session_id}")
    if credential.startswith(KEY_PREFIX):
        with Session(engine) as session:
            _authorized_session(session_id, session, authorization)
        snap = svc.read_session(session_id, engine=engine)
        if snap is None:
            raise not_found
        return snap
    return _token_snapshot(svc.read_session_by_token(credential, engine=engine), session_id)


def _token_snapshot(snap: svc.SessionSnapshot | None, session_id: int) -> svc.SessionSnapshot:
    """The snapshot read by a session token, checked against the session in the path."""
    if snap is None:
        raise AuthenticationError("unknown session token")
    if snap.id != session_id:
        raise svc.SessionNotFoundError(f"no session {session_id}")
    return snap


async def get_start_study(
    slug: str, request: Request, engine: EngineDep, authorization: AuthHeader = None
) -> Study | svc.StudyHead:
    """The session start's authorization: :func:`get_api_researcher` and
    :func:`get_owned_study` (same rules, same errors), in the event loop on PostgreSQL
    (one statement, a :class:`~app.session.StudyHead`), else in one thread-pool
    hop (the study's row)."""
    credential = _bearer(authorization)
    db = getattr(request.app.state, "answers_db", None)
    if db is not None:
        return await answer_async.owned_study(db, credential, slug)
    return await run_in_threadpool(_owned_study_sync, slug, engine, authorization)


def _owned_study_sync(slug: str, engine: Engine, authorization: str | None) -> Study:
    with Session(engine) as session:
        researcher = get_api_researcher(session, authorization)
    with Session(engine) as session:
        return get_owned_study(slug, researcher, session)


ApiResearcher = Annotated[Researcher, Depends(get_api_researcher)]
StartStudy = Annotated[Study | svc.StudyHead, Depends(get_start_study)]
AuthorizedSession = Annotated[tuple[ElicitationSession, Study], Depends(get_authorized_session)]


# ----- routes -------------------------------------------------------------------------------------


def _session_out(view: svc.SessionView) -> dict[str, Any]:
    q = view.question
    return {
        "session_id": view.session_id,
        "status": view.status,
        "phase": view.phase,
        "questions_answered": view.n_posed,
        "max_questions": view.max_questions,
        "allow_skip": view.allow_skip,
        "question": None
        if q is None
        else {
            "item": q.key,
            "text": q.text,
            "options": [{"letter": a, "label": b} for a, b in q.options],
            "number": q.number,
            "topic": q.topic,
        },
        "stop_reason": view.stop_reason,
    }


@router.post(
    "/studies/{slug}/sessions",
    status_code=201,
    response_model=SessionCreated,
    summary="Create a session for a study",
    description="Creates a live respondent (with an optional external id and known "
    "attributes) and its adaptive session, and chooses the first question. Needs an API key "
    "that may see the study (its owner's, one it is shared with, an admin's). A draft study "
    "accepts sessions too (to try it before publishing), a closed one none (409 "
    "study_not_open). The returned token is shown once.",
)
async def create_session(
    request: Request,
    body: CreateSessionIn,
    study: StartStudy,
    engine: EngineDep,
) -> dict[str, Any]:
    problem = None if body.external_id is None else external_id_problem(body.external_id)
    if problem is not None:
        raise InvalidInputError(f"external_id: {problem}")
    # On PostgreSQL the API key, the study and (with the study's runtime cached) the start
    # itself run in the event loop (app/session/async_path.py); otherwise one hop.
    db = getattr(request.app.state, "answers_db", None)
    try:
        if db is not None and isinstance(study, svc.StudyHead):
            started = await answer_async.start_session(
                db, study, engine=engine, attributes=body.attributes, external_id=body.external_id
            )
        else:
            started = await run_in_threadpool(
                svc.start_session,
                study,
                engine=engine,
                attributes=body.attributes,
                external_id=body.external_id,
                allow_draft=True,
            )
    except svc.ExternalIdTakenError as exc:
        # a create retried after a lost reply: say where the first one's session is
        sid = await run_in_threadpool(
            respondents.session_of_external_id,
            int(study.id or 0),
            str(body.external_id),
            engine=engine,
        )
        if sid is not None:
            exc.message += f"; its session is {sid} (GET /api/v1/sessions/{sid} with this key)"
        raise
    if request.app.state.settings.session_rate_limit_per_minute > 0:
        # the new token is verified: its calls count on its own counter from the first
        await ratelimit.register_new_credential(request.app.state, started.token)
    resume = request.url_for("respondent_resume", slug=study.slug, token=started.token)
    return {
        **_session_out(started.view),
        "token": started.token,
        "respondent_id": started.respondent_id,
        "resume_url": str(resume),
    }


@router.get(
    "/sessions/{session_id}",
    response_model=SessionDetail,
    summary="Get a session: status, answers and the next question",
)
def get_session(auth: AuthorizedSession, session: SessionDep) -> dict[str, Any]:
    sess, study = auth
    view = svc.session_view(study, sess, session=session)
    answers = svc.session_answers(sess, session=session)
    return {
        **_session_out(view),
        "study": study.slug,
        "answers": [
            {"item": a.item, "option": a.option, "answered_at": a.answered_at} for a in answers
        ],
    }


@router.post(
    "/sessions/{session_id}/answers",
    response_model=AnswerReplyOut,
    summary="Answer the current question",
    description="Stores the answer (option null = prefer not to answer, when the study allows "
    "it) and returns the next question or completion. Retrying with the same idempotency_key "
    "(or sending the same option to the same item again) returns the same result with "
    "replayed true and the header Idempotent-Replayed: true; answering an item again with "
    "another option is 409.",
    responses={
        200: {
            "headers": {
                REPLAYED_HEADER: {
                    "description": "true when the reply is a replay of an answer stored "
                    "earlier (replayed true); absent otherwise",
                    "schema": {"type": "string", "enum": ["true"]},
                }
            }
        }
    },
)
async def post_answer(
    session_id: SessionIdPath,
    body: AnswerIn,
    request: Request,
    engine: EngineDep,
    authorization: AuthHeader = None,
) -> Response:
    # The hottest call. With a session token on PostgreSQL its common case runs in the
    # event loop (app/session/async_path.py); otherwise the authorization and the
    # answer run in ONE thread-pool hop (a ``def`` dependency would be a hop of its own).
    db = getattr(request.app.state, "answers_db", None)
    credential = _bearer(authorization)
    if db is not None and not credential.startswith(KEY_PREFIX):
        deferred = request.scope.get(ratelimit.DEFERRED_SCOPE_KEY)
        if deferred is not None:  # the rate limiter's count is ours to add (one statement)
            counter_key, limit = deferred
            count, expires, read = await answer_async.read_counted_session_and_history(
                db, credential, counter_key
            )
            if count > limit:
                return ratelimit.rate_limited_response(expires, limit)
        else:
            read = await answer_async.read_session_and_history(db, credential)
        snap = _token_snapshot(None if read is None else read[0], session_id)
        assert read is not None  # _token_snapshot refused an unknown token
        view = await answer_async.submit_answer(
            db,
            snap,
            item_key=body.item,
            option=body.option,
            idempotency_key=body.idempotency_key,
            engine=engine,
            history=read[1],
        )
    else:
        view = await run_in_threadpool(_post_answer_sync, session_id, body, engine, authorization)
    # Built by this module (the shape of AnswerReplyOut, which documents it): returned as
    # a Response so it is not validated a second time on the hot path.
    return JSONResponse(
        {**_session_out(view), "replayed": view.replayed},
        headers={REPLAYED_HEADER: "true"} if view.replayed else None,
    )


def _post_answer_sync(
    session_id: int, body: AnswerIn, engine: Engine, authorization: str | None
) -> svc.SessionView:
    target = get_answer_target(session_id, engine, authorization)
    return svc.submit_answer(
        target.study,
        target.id,
        item_key=body.item,
        option=body.option,
        idempotency_key=body.idempotency_key,
        engine=engine,
        snapshot=target,
    )


@router.get(
    "/sessions/{session_id}/predictions",
    response_model=PredictionsOut,
    summary="Predictions for every item the respondent has not answered, and the top personas",
    description="From the respondent's posterior given everything they answered (all "
    "their sessions), under the model of their session in progress, else the study's active model. `items`: the questions not "
    "asked yet; `targets`: every target; `predicted`: every item without an answer "
    "(questions, targets, attributes; never asked or skipped) with its most probable option.",
)
def get_predictions(auth: AuthorizedSession, session: SessionDep) -> dict[str, Any]:
    sess, study = auth
    n_answers, found = session_predictions(study, sess, session=session)
    as_dict = lambda x: {  # noqa: E731
        "item": x.key,
        "role": x.role,
        "question": x.question,
        "status": x.status,
        "distribution": x.distribution,
    }
    return {
        "answers": n_answers,
        "items": [
            as_dict(x) for x in found.items if x.role == "question" and x.status == NOT_ASKED
        ],
        "targets": [as_dict(x) for x in found.items if x.role == "target"],
        "personas": list(found.personas),
        "predicted": [x.to_dict() for x in found.unanswered],
        "model_id": found.model_id,
    }


@router.get(
    "/sessions/{session_id}/explanation",
    response_model=ExplanationOut,
    summary="Why the last question was chosen: every candidate's score",
)
def get_explanation(auth: AuthorizedSession, session: SessionDep) -> dict[str, Any]:
    sess, study = auth
    return svc.explanation(study, sess, session=session)


@router.get(
    "/sessions/{session_id}/profile",
    response_model=ProfileOut,
    summary="The respondent's preference profile (ranked criteria and items, plain-text "
    "summary) and the predicted answer to every item they have not answered",
)
def get_profile(auth: AuthorizedSession, session: SessionDep) -> dict[str, Any]:
    sess, study = auth
    return session_profile(study, sess, session=session)


@router.post(
    "/sessions/{session_id}/finish",
    response_model=SessionOut,
    summary="Finish the session now",
    description="Ends the session as completed before the study's stopping rule (e.g. after "
    "the few questions your product needed): its answers count as a completed respondent's "
    "(for the study's refits too), and it takes no more answers (409 session_closed). "
    "Finishing a completed session again returns it; an abandoned one is 409.",
)
def finish(auth: AuthorizedSession, engine: EngineDep, session: SessionDep) -> dict[str, Any]:
    sess, study = auth
    release(session)
    return _session_out(svc.finish_session(study, sess.id or 0, engine=engine))


@router.delete(
    "/sessions/{session_id}",
    response_model=ErasedOut,
    summary="Erase the respondent's data",
    description="Deletes the respondent with every session, answer, attribute, decision and "
    "state; the study keeps only counts. The token stops working.",
)
def erase(auth: AuthorizedSession, engine: EngineDep, session: SessionDep) -> dict[str, Any]:
    sess, _study = auth
    release(session)
    result = svc.erase_respondent(sess, engine=engine)
    return {
        "erased": True,
        "respondent_id": result.respondent_id,
        "sessions": result.n_sessions,
        "answers": result.n_answers,
    }
