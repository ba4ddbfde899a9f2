"""The respondent's pages under ``/s/{slug}`` (full pages, and htmx partials of the same
templates).

Flow: consent (or decline) → the study's attribute questions (when it asks them) → one
adaptive question per page → completion. Every form is a plain POST that answers with a
303 redirect to the page of the new state (works with JavaScript off); with htmx the same
POST (``HX-Request`` header) answers with the ``survey`` block of the next page, swapped in
place, or an ``HX-Redirect`` to the completion page.

The respondent is recognised by a signed, HttpOnly, SameSite=Lax cookie per study
(``Secure`` when ``PRIORLY_ENV=prod``) holding the session id and token; the resume link
``/s/{slug}/resume/{token}`` (shown on the first question page) sets it again in another
browser or after the cookie was cleared. Link parameters of the start page (for example
``PROLIFIC_PID``) are stored with the respondent.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import quote, urlsplit

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from itsdangerous import BadSignature, URLSafeSerializer
from sqlmodel import Session

from app import session as svc
from app.deps import EngineDep, SessionDep, SettingsDep, TemplatesDep
from app.errors import InvalidInputError, NotFoundError, PriorlyError
from app.services.demo import survey_readiness
from app.services.studies import get_study_by_slug
from app.settings import Settings
from app.tables import ElicitationSession, SessionStatus, Study, StudyStatus

router = APIRouter(prefix="/s", include_in_schema=False)

COOKIE_SALT = "priorly.respondent-session"
COOKIE_MAX_AGE_S = 30 * 24 * 3600
PANEL_FIELD_PREFIX = "p_"
ATTRIBUTE_FIELD_PREFIX = "a_"


# ----- helpers ----------------------------------------------------------------------------


def _cookie_name(study: Study) -> str:
    return f"priorly_s{study.id}"


def _serializer(settings: Settings) -> URLSafeSerializer:
    return URLSafeSerializer(settings.secret_key.get_secret_value(), salt=COOKIE_SALT)


def _set_cookie(
    response: Response, study: Study, session_id: int, token: str, settings: Settings
) -> None:
    response.set_cookie(
        _cookie_name(study),
        _serializer(settings).dumps({"s": session_id, "t": token}),
        max_age=COOKIE_MAX_AGE_S,
        path=f"/s/{study.slug}",
        httponly=True,
        samesite="lax",
        secure=settings.env == "prod",
    )


def _session_from_cookie(
    request: Request, study: Study, session: Session, settings: Settings
) -> ElicitationSession | None:
    """The session named by this study's cookie, if the cookie is genuine and current."""
    raw = request.cookies.get(_cookie_name(study))
    if not raw:
        return None
    try:
        data = _serializer(settings).loads(raw)
        token = str(data["t"])
        sid = int(data["s"])
    except (BadSignature, KeyError, TypeError, ValueError):
        return None
    try:
        sess = svc.get_session_by_token(token, session=session)
    except svc.SessionNotFoundError:
        return None
    if sess.id != sid or sess.study_id != study.id:
        return None
    return sess


def get_open_study(slug: str, session: SessionDep) -> Study | None:
    """The study of ``/s/{slug}`` if it exists and is published, else ``None``."""
    try:
        study = get_study_by_slug(slug, session=session)
    except NotFoundError:
        return None
    return study if study.status == StudyStatus.published.value else None


OpenStudyDep = Annotated[Study | None, Depends(get_open_study)]


@dataclass(frozen=True)
class Visit:
    """The open study of ``/s/{slug}`` and this browser's session of it.

    Attributes:
        study: the published study, or ``None`` (no such study, or not open).
        sess: the session named by the study's genuine, current cookie, or ``None``.
    """

    study: Study | None
    sess: ElicitationSession | None

    def require_session(
        self, request: Request, templates: Any
    ) -> Response | tuple[Study, ElicitationSession]:
        """``(study, session)``, or the response of a page that cannot be shown: the
        "not available" page (404) without an open study, the start page (303) without
        a session."""
        if self.study is None:
            return _not_open(request, templates)
        if self.sess is None:
            return _see(str(request.url_for("respondent_start", slug=self.study.slug)))
        return self.study, self.sess


def get_visit(
    request: Request, study: OpenStudyDep, session: SessionDep, settings: SettingsDep
) -> Visit:
    """The :class:`Visit` of this request (the cookie is read only for an open study)."""
    if study is None:
        return Visit(None, None)
    return Visit(study, _session_from_cookie(request, study, session, settings))


VisitDep = Annotated[Visit, Depends(get_visit)]


def _is_htmx(request: Request) -> bool:
    return request.headers.get("HX-Request") == "true"


def _see(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


def message_page(
    request: Request,
    templates: Any,
    title: str,
    text: str,
    status_code: int = 200,
    study: Study | None = None,
) -> HTMLResponse:
    """A respondent-facing message page (also used by the group-round links)."""
    return templates.TemplateResponse(  # type: ignore[no-any-return]
        request,
        "pages/respondent_message.html",
        {"title": title, "text": text, "study": study},
        status_code=status_code,
    )


def _not_open(request: Request, templates: Any) -> HTMLResponse:
    return message_page(
        request,
        templates,
        "Survey not available",
        "This survey does not exist or is not open. Please check the link you were given.",
        status_code=404,
    )


def _not_ready(request: Request, templates: Any, study: Study) -> HTMLResponse:
    return message_page(
        request,
        templates,
        "Survey not ready",
        "This survey is not ready yet. Please try again later.",
        status_code=503,
        study=study,
    )


def _safe_redirect(url: str | None, code: str) -> str | None:
    """The study's redirect URL with ``{code}`` filled in; only http(s) URLs are used."""
    if not url:
        return None
    filled = url.replace("{code}", quote(code, safe=""))
    return filled if urlsplit(filled).scheme in ("http", "https") else None


def _progress(view: svc.SessionView) -> dict[str, Any]:
    total = max(view.max_questions, 1)
    return {"done": view.n_posed, "total": total, "percent": round(100 * view.n_posed / total)}


def _question_context(
    study: Study,
    view: svc.SessionView,
    *,
    error: str | None = None,
    notice: str | None = None,
    resume_url: str | None = None,
) -> dict[str, Any]:
    return {
        "study": study,
        "view": view,
        "q": view.question,
        "progress": _progress(view),
        "idempotency_key": secrets.token_urlsafe(16),
        "error": error,
        "notice": notice,
        "resume_url": resume_url,
    }


# ----- pages --------------------------------------------------------------------------------


@router.get("/{slug}", response_class=HTMLResponse, name="respondent_start")
def start_page(
    slug: str, request: Request, visit: VisitDep, session: SessionDep, templates: TemplatesDep
) -> Response:
    """The consent page (or straight to the current page when a session cookie exists);
    the "preparing" page while the study's first model is being fitted, whose poll
    (``HX-Trigger: preparing``) gets 204 until then and ``HX-Refresh`` after; "not
    ready" (503) for a study without a model and without a fit job."""
    study = visit.study
    if study is None:
        return _not_open(request, templates)
    readiness = survey_readiness(study, session=session) if visit.sess is None else "ready"
    polled = request.headers.get("HX-Trigger") == "preparing"
    if readiness == "preparing":
        if polled:
            return Response(status_code=204)
        return templates.TemplateResponse(
            request, "pages/respondent_preparing.html", {"study": study}
        )
    if polled:
        return Response(headers={"HX-Refresh": "true"})
    if readiness == "no_model":
        return _not_ready(request, templates, study)
    if visit.sess is not None:
        return _see(str(request.url_for("respondent_question", slug=slug)))
    try:
        panel = svc.clean_panel_params(dict(request.query_params)) or {}
    except InvalidInputError as exc:
        return message_page(request, templates, "Invalid link", exc.message, 422, study)
    return templates.TemplateResponse(
        request, "pages/respondent_consent.html", {"study": study, "panel": panel}
    )


@router.post("/{slug}/consent", name="respondent_consent")
async def consent(
    slug: str,
    request: Request,
    study: OpenStudyDep,
    session: SessionDep,
    engine: EngineDep,
    templates: TemplatesDep,
    settings: SettingsDep,
) -> Response:
    """Accept (create the respondent and session) or decline (nothing is stored)."""
    if study is None:
        return _not_open(request, templates)
    if survey_readiness(study, session=session) != "ready":  # never fit while one waits
        return _see(str(request.url_for("respondent_start", slug=slug)))
    form = await request.form()
    if form.get("choice") != "accept":
        return _see(str(request.url_for("respondent_declined", slug=slug)))
    panel = {
        str(k)[len(PANEL_FIELD_PREFIX) :]: str(v)
        for k, v in form.multi_items()
        if str(k).startswith(PANEL_FIELD_PREFIX)
    }
    settings_ = svc.study_settings(study)
    session.close()  # see app.routes.api_v1.release: one pooled connection per request at a time
    try:
        started = svc.start_session(
            study, engine=engine, panel_params=panel, ask_attributes=settings_.ask_attributes
        )
    except PriorlyError as exc:
        return message_page(request, templates, "Cannot start the survey", exc.message, 409, study)
    response = _see(str(request.url_for("respondent_question", slug=slug)))
    _set_cookie(response, study, started.session_id, started.token, settings)
    return response


@router.get("/{slug}/declined", response_class=HTMLResponse, name="respondent_declined")
def declined(request: Request, study: OpenStudyDep, templates: TemplatesDep) -> Response:
    """The page after declining: nothing was stored."""
    if study is None:
        return _not_open(request, templates)
    return message_page(
        request,
        templates,
        "No problem",
        "You chose not to take part. Nothing was recorded. You can close this page.",
        study=study,
    )


@router.get("/{slug}/resume/{token}", name="respondent_resume")
def resume(
    slug: str,
    token: str,
    request: Request,
    study: OpenStudyDep,
    session: SessionDep,
    templates: TemplatesDep,
    settings: SettingsDep,
) -> Response:
    """Continue a session from its resume link (sets the cookie again)."""
    try:
        if study is None:
            raise NotFoundError(f"survey {slug!r} is not open")
        sess = svc.get_session_by_token(token, session=session)
        if sess.study_id != study.id:
            raise svc.SessionNotFoundError("not this study")
    except NotFoundError:
        return message_page(
            request,
            templates,
            "Link not valid",
            "This resume link is not valid (the survey may be closed, or your answers were "
            "deleted).",
            404,
        )
    response = _see(str(request.url_for("respondent_question", slug=slug)))
    _set_cookie(response, study, sess.id or 0, token, settings)
    return response


@router.get("/{slug}/q", response_class=HTMLResponse, name="respondent_question")
def question_page(
    request: Request,
    visit: VisitDep,
    session: SessionDep,
    templates: TemplatesDep,
    settings: SettingsDep,
) -> Response:
    """The page of the session's current state: attribute questions, a question, or done."""
    got = visit.require_session(request, templates)
    if isinstance(got, Response):
        return got
    study, sess = got
    view = svc.session_view(study, sess, session=session)
    return _render_view(request, templates, study, sess, view, session=session, settings=settings)


def _render_error(
    request: Request,
    templates: Any,
    study: Study,
    sess: ElicitationSession,
    *,
    session: Session,
    settings: Settings,
    error: str,
    htmx: bool,
) -> Response:
    """The current page again with ``error`` shown (422 for a plain POST, 200 for htmx)."""
    view = svc.session_view(study, sess, session=session)
    return _render_view(
        request,
        templates,
        study,
        sess,
        view,
        session=session,
        settings=settings,
        error=error,
        status_code=200 if htmx else 422,
        partial=htmx,
    )


def _after_submit(
    request: Request,
    templates: Any,
    study: Study,
    sess: ElicitationSession,
    view: svc.SessionView,
    *,
    session: Session,
    settings: Settings,
    htmx: bool,
) -> Response:
    """After a stored submission: redirect a plain POST (post-redirect-get), swap for htmx."""
    if not htmx:
        return _see(str(request.url_for("respondent_question", slug=study.slug)))
    return _render_view(
        request, templates, study, sess, view, session=session, settings=settings, partial=True
    )


def _render_view(
    request: Request,
    templates: Any,
    study: Study,
    sess: ElicitationSession,
    view: svc.SessionView,
    *,
    session: Session,
    settings: Settings,
    token: str | None = None,
    error: str | None = None,
    notice: str | None = None,
    status_code: int = 200,
    partial: bool = False,
) -> Response:
    if view.phase == "done":
        url = str(request.url_for("respondent_done", slug=study.slug))
        if partial:
            return Response(status_code=200, headers={"HX-Redirect": url})
        return _see(url)
    if token is None:
        token = _token_from_cookie(request, study, settings)
    resume_url = (
        str(request.url_for("respondent_resume", slug=study.slug, token=token)) if token else None
    )
    if view.phase == "attributes":
        rt = svc.load_runtime(study, session=session, fit_if_missing=False)
        context = {
            "study": study,
            "attributes": rt.attributes,
            "allow_skip": rt.allow_skip,
            "error": error,
            "resume_url": resume_url,
        }
        return templates.TemplateResponse(  # type: ignore[no-any-return]
            request,
            "pages/respondent_about.html",
            context,
            status_code=status_code,
            block_name="survey" if partial else None,
        )
    context = _question_context(study, view, error=error, notice=notice, resume_url=resume_url)
    return templates.TemplateResponse(  # type: ignore[no-any-return]
        request,
        "pages/respondent_question.html",
        context,
        status_code=status_code,
        block_name="survey" if partial else None,
    )


def _token_from_cookie(request: Request, study: Study, settings: Settings) -> str | None:
    raw = request.cookies.get(_cookie_name(study))
    if not raw:
        return None
    try:
        return str(_serializer(settings).loads(raw)["t"])
    except (BadSignature, KeyError, TypeError, ValueError):
        return None


@router.post("/{slug}/about", name="respondent_about")
async def about(
    request: Request,
    visit: VisitDep,
    session: SessionDep,
    engine: EngineDep,
    templates: TemplatesDep,
    settings: SettingsDep,
) -> Response:
    """Store the attribute answers ("prefer not to answer" leaves one out)."""
    got = visit.require_session(request, templates)
    if isinstance(got, Response):
        return got
    study, sess = got
    form = await request.form()
    rt = svc.load_runtime(study, session=session, fit_if_missing=False)
    attrs: dict[str, str] = {}
    missing: list[str] = []
    for item in rt.attributes:
        value = str(form.get(ATTRIBUTE_FIELD_PREFIX + item.key, "") or "")
        if value and value != "__skip__":
            attrs[item.key] = value
        elif not value and not rt.allow_skip:
            missing.append(item.question)
    htmx = _is_htmx(request)
    if missing:
        return _render_error(
            request,
            templates,
            study,
            sess,
            session=session,
            settings=settings,
            error="Please answer every question.",
            htmx=htmx,
        )
    session.close()  # one pooled connection per request at a time
    try:
        view = svc.submit_attributes(study, sess.id or 0, attrs, engine=engine)
    except InvalidInputError as exc:
        return _render_error(
            request,
            templates,
            study,
            sess,
            session=session,
            settings=settings,
            error=exc.message,
            htmx=htmx,
        )
    return _after_submit(
        request, templates, study, sess, view, session=session, settings=settings, htmx=htmx
    )


@router.post("/{slug}/answer", name="respondent_answer")
async def answer(
    slug: str,
    request: Request,
    visit: VisitDep,
    session: SessionDep,
    engine: EngineDep,
    templates: TemplatesDep,
    settings: SettingsDep,
) -> Response:
    """Store the answer to the current question; show the next one (or completion)."""
    got = visit.require_session(request, templates)
    if isinstance(got, Response):
        return got
    study, sess = got
    form = await request.form()
    htmx = _is_htmx(request)
    item_key = str(form.get("item", ""))
    skip = form.get("skip") is not None
    option = None if skip else str(form.get("option", "") or "")
    idem = str(form.get("idempotency_key", "") or "") or None
    if not skip and not option:
        view = svc.session_view(study, sess, session=session)
        return _render_view(
            request,
            templates,
            study,
            sess,
            view,
            session=session,
            settings=settings,
            error="Please choose an answer"
            + (" or press “Prefer not to answer”." if view.allow_skip else "."),
            status_code=200 if htmx else 422,
            partial=htmx,
        )
    session.close()  # one pooled connection per request at a time
    try:
        view = svc.submit_answer(
            study,
            sess.id or 0,
            item_key=item_key,
            option=option,
            idempotency_key=idem,
            engine=engine,
        )
    except (svc.AnswerConflictError, svc.NotCurrentQuestionError, svc.SessionClosedError):
        view = svc.session_view(study, sess, session=session)
        notice = "That question was already answered (perhaps in another tab). Here is where you are now."
        if not htmx:
            return _see(str(request.url_for("respondent_question", slug=slug)))
        return _render_view(
            request,
            templates,
            study,
            sess,
            view,
            session=session,
            settings=settings,
            notice=notice,
            partial=True,
        )
    except InvalidInputError as exc:
        return _render_error(
            request,
            templates,
            study,
            sess,
            session=session,
            settings=settings,
            error=exc.message,
            htmx=htmx,
        )
    return _after_submit(
        request, templates, study, sess, view, session=session, settings=settings, htmx=htmx
    )


@router.get("/{slug}/done", response_class=HTMLResponse, name="respondent_done")
def done(
    slug: str,
    request: Request,
    visit: VisitDep,
    templates: TemplatesDep,
    settings: SettingsDep,
) -> Response:
    """The completion page: the completion code and, if configured, the redirect link."""
    got = visit.require_session(request, templates)
    if isinstance(got, Response):
        return got
    study, sess = got
    if sess.status != SessionStatus.completed.value:
        return _see(str(request.url_for("respondent_question", slug=slug)))
    code = svc.completion_code(study, sess.id or 0, settings.secret_key.get_secret_value())
    return templates.TemplateResponse(
        request,
        "pages/respondent_done.html",
        {"study": study, "code": code, "redirect_url": _safe_redirect(study.redirect_url, code)},
    )
