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
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from itsdangerous import BadSignature, URLSafeSerializer
from sqlmodel import Session

from app import respondent_text
from app import session as svc
from app.deps import EngineDep, SessionDep, SettingsDep, TemplatesDep, form_str
from app.errors import InvalidInputError, NotFoundError, PriorlyError
from app.respondent_text import Words, language_of, supported_language, words
from app.services.demo import survey_readiness
from app.services.learned import learned_about
from app.services.respondent_pages import (
    PANEL_FIELD_PREFIX,
    completion_redirect,
    erased_text,
    retry_after_limit,
    slug_language,
)
from app.services.studies import get_study_by_slug
from app.settings import Settings
from app.tables import ElicitationSession, SessionStatus, Study, StudyStatus


class NoStoreRoute(APIRoute):
    """A route whose responses carry ``Cache-Control: no-store``: the browser never shows a
    respondent page from its cache (Back to the consent page asks the server again, which
    sees the session cookie and resumes)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def no_store(request: Request) -> Response:
            response = await handler(request)
            response.headers["Cache-Control"] = "no-store"
            return response

        return no_store


PARTIAL_BLOCKS = ["partial_title", "survey"]
"""What an htmx partial of a survey page renders: its ``<title>`` (htmx updates the
window's title from it), then the ``survey`` block that replaces ``#survey``."""

router = APIRouter(prefix="/s", include_in_schema=False, route_class=NoStoreRoute)

COOKIE_SALT = "priorly.respondent-session"
COOKIE_MAX_AGE_S = 30 * 24 * 3600
BROWSER_SALT = "priorly.respondent-browser"
BROWSER_MAX_AGE_S = 365 * 24 * 3600
LOST_PARAM = "priorly_lost"
"""Start-page parameter (never a link parameter): this browser posted a survey form
without its session cookie, so the page says its answers are not in this browser."""
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


def _browser_cookie_name(study: Study) -> str:
    return f"priorly_b{study.id}"


def _earlier_starts(request: Request, study: Study, settings: Settings) -> int:
    """Respondents this browser started in the study before (its signed counter cookie,
    kept when the session cookie is gone: a repeated start is flagged, not refused)."""
    raw = request.cookies.get(_browser_cookie_name(study))
    if not raw:
        return 0
    try:
        serializer = URLSafeSerializer(settings.secret_key.get_secret_value(), salt=BROWSER_SALT)
        return max(0, int(serializer.loads(raw)["n"]))
    except (BadSignature, KeyError, TypeError, ValueError):
        return 0


def _set_browser_cookie(response: Response, study: Study, n: int, settings: Settings) -> None:
    response.set_cookie(
        _browser_cookie_name(study),
        URLSafeSerializer(settings.secret_key.get_secret_value(), salt=BROWSER_SALT).dumps(
            {"n": n}
        ),
        max_age=BROWSER_MAX_AGE_S,
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


def _study_in(slug: str, statuses: frozenset[str], session: Session) -> Study | None:
    """The study of ``/s/{slug}`` if it exists and its status is one of ``statuses``."""
    try:
        study = get_study_by_slug(slug, session=session)
    except NotFoundError:
        return None
    return study if study.status in statuses else None


def get_open_study(slug: str, session: SessionDep) -> Study | None:
    """The study of ``/s/{slug}`` if it exists and is published, else ``None``."""
    return _study_in(slug, frozenset({StudyStatus.published.value}), session)


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
        "not available" page (404) without an open study, the start page without a
        session (303; for htmx an ``HX-Redirect``, a full page and not a consent page
        inside the survey card). A form posted without a session (the cookie was lost
        mid-survey) goes to the start page with :data:`LOST_PARAM`, which says so."""
        if self.study is None:
            return _not_open(request, templates)
        if self.sess is None:
            start = str(request.url_for("respondent_start", slug=self.study.slug))
            if request.method == "POST":
                start += f"?{LOST_PARAM}=1"
            if _is_htmx(request):
                return Response(headers={"HX-Redirect": start})
            return _see(start)
        return self.study, self.sess

    def page(
        self, request: Request, templates: Any, session: Session, settings: Settings
    ) -> Response | RespondentPage:
        """The :class:`RespondentPage` of this request, or the response of
        :meth:`require_session` when there is no page to show."""
        got = self.require_session(request, templates)
        if isinstance(got, Response):
            return got
        return RespondentPage(request, templates, got[0], got[1], session, settings)


def get_visit(
    request: Request, study: OpenStudyDep, session: SessionDep, settings: SettingsDep
) -> Visit:
    """The :class:`Visit` of this request (the cookie is read only for an open study)."""
    if study is None:
        return Visit(None, None)
    return Visit(study, _session_from_cookie(request, study, session, settings))


VisitDep = Annotated[Visit, Depends(get_visit)]


@dataclass(frozen=True)
class RespondentPage:
    """One request's respondent page: the study, this browser's session of it, and what
    renders it.

    :meth:`render` draws the page of the session's current state (attribute questions, a
    question, or a redirect to completion), in full or, with ``partial``, as the ``survey``
    block for htmx; :meth:`again` draws it with an error (422 for a plain POST, 200 for
    htmx); :meth:`after_submit` answers a stored submission.
    """

    request: Request
    templates: Any
    study: Study
    sess: ElicitationSession
    session: Session
    settings: Settings

    @property
    def htmx(self) -> bool:
        """Whether the request came from htmx (answer with a partial, not a redirect)."""
        return _is_htmx(self.request)

    @property
    def language(self) -> str:
        """The language of the study's respondent pages."""
        return language_of(self.study.settings)

    def say(self, key: str, /, **params: Any) -> str:
        """Message ``key`` of :mod:`app.respondent_text` in the page's language."""
        return respondent_text.text(self.language, key, **params)

    def view(self) -> svc.SessionView:
        """The session's current state."""
        return svc.session_view(self.study, self.sess, session=self.session)

    def again(
        self,
        error: str | None = None,
        *,
        status_code: int = 422,
        view: svc.SessionView | None = None,
        attribute_page: int | None = None,
        confirm_skip: bool = False,
        chosen: dict[str, str] | None = None,
    ) -> Response:
        """The current page again with ``error`` (``status_code`` for a plain POST);
        ``chosen``: a refused page of questions about the respondent keeps these choices
        (``{key: letter or "__skip__"}``) and marks its other questions as left blank."""
        return self.render(
            view,
            error=error,
            status_code=200 if self.htmx else status_code,
            partial=self.htmx,
            attribute_page=attribute_page,
            confirm_skip=confirm_skip,
            chosen=chosen,
        )

    def after_submit(self, view: svc.SessionView) -> Response:
        """After a stored submission: redirect a plain POST (post-redirect-get), swap for
        htmx."""
        if not self.htmx:
            return _see(str(self.request.url_for("respondent_question", slug=self.study.slug)))
        return self.render(view, partial=True)

    def render(
        self,
        view: svc.SessionView | None = None,
        *,
        error: str | None = None,
        notice: str | None = None,
        status_code: int = 200,
        partial: bool = False,
        attribute_page: int | None = None,
        confirm_skip: bool = False,
        chosen: dict[str, str] | None = None,
    ) -> Response:
        """The page of ``view`` (the session's current state when ``None``)."""
        if view is None:
            view = self.view()
        if view.phase == "done":
            url = str(self.request.url_for("respondent_done", slug=self.study.slug))
            if partial:
                return Response(status_code=200, headers={"HX-Redirect": url})
            return _see(url)
        token = _token_from_cookie(self.request, self.study, self.settings)
        resume_url = (
            str(self.request.url_for("respondent_resume", slug=self.study.slug, token=token))
            if token
            else None
        )
        rt = svc.load_runtime(self.study, session=self.session, fit_if_missing=False)
        if view.phase == "attributes":
            pages = svc.attribute_pages(rt)
            number = min(max(attribute_page or 1, 1), max(len(pages), 1))
            items = pages[number - 1] if pages else []
            first = (number - 1) * svc.ATTRIBUTES_PER_PAGE
            context = {
                "study": self.study,
                "attributes": [
                    (item, svc.attribute_question(item, self.language)) for item in items
                ],
                "stored": {
                    **svc.respondent_attributes(self.sess, session=self.session),
                    **(chosen or {}),
                },
                "blank": (
                    {item.key for item in items if item.key not in chosen}
                    if chosen is not None
                    else set()
                ),
                "page": number,
                "n_pages": len(pages),
                "last": first + len(items),
                "progress": _progress(first, len(rt.attributes) + rt.max_questions, first + 1),
                "allow_skip": rt.allow_skip,
                "confirm_skip": confirm_skip,
                "error": error,
                "resume_url": resume_url,
                "preview": self.sess.is_preview,
            }
            response = self.templates.TemplateResponse(
                self.request,
                "pages/respondent_about.html",
                context,
                status_code=status_code,
                block_names=PARTIAL_BLOCKS if partial else [],
            )
            if partial:  # the address bar names the page shown (refresh and Back keep it)
                path = self.request.url_for("respondent_question", slug=self.study.slug).path
                response.headers["HX-Push-Url"] = f"{path}?page={number}"
            return response  # type: ignore[no-any-return]
        context = _question_context(
            self.study,
            view,
            n_attributes=_asked_attributes(rt),
            error=error,
            notice=notice,
            resume_url=resume_url,
        )
        context["preview"] = self.sess.is_preview
        return self.templates.TemplateResponse(  # type: ignore[no-any-return]
            self.request,
            "pages/respondent_question.html",
            context,
            status_code=status_code,
            block_names=PARTIAL_BLOCKS if partial else [],
        )


def _token_from_cookie(request: Request, study: Study, settings: Settings) -> str | None:
    raw = request.cookies.get(_cookie_name(study))
    if not raw:
        return None
    try:
        return str(_serializer(settings).loads(raw)["t"])
    except (BadSignature, KeyError, TypeError, ValueError):
        return None


def _is_htmx(request: Request) -> bool:
    return request.headers.get("HX-Request") == "true"


def _see(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


def _slug_in(request: Request) -> str | None:
    """The survey slug of a request under ``/s/{slug}``, matched by a route or not."""
    slug = request.path_params.get("slug")
    if isinstance(slug, str):
        return slug
    parts = request.url.path.split("/")
    return parts[2] if len(parts) > 2 and parts[1] == "s" and parts[2] else None


def message_page(
    request: Request,
    templates: Any,
    title: Words | str,
    text: Words | str,
    status_code: int = 200,
    study: Study | None = None,
    *,
    detail: str | None = None,
    language: str | None = None,
) -> HTMLResponse:
    """A respondent-facing message page (also used by the group-round links); ``detail``:
    a technical line under the text, in small print (what to quote to the study team).

    ``title`` and ``text`` are :class:`app.respondent_text.Words`, said in the page's
    language: ``language`` when given, else the study's, else (no study, e.g. the "not
    available" page of a closed survey) the language of the study its address names
    (:func:`app.services.respondent_pages.slug_language`), else English. A plain string is
    shown as it is.

    A survey page refused for too many requests (429, from the app's handler, which knows
    no study) is headed with the study's name and gets a "Try again" link
    (:func:`app.services.respondent_pages.retry_after_limit`)."""
    retry_url = None
    slug = _slug_in(request)
    if status_code == 429 and study is None and slug is not None:
        study, retry_url = retry_after_limit(
            slug,
            request.url.path,
            getattr(request.state, "refused_form", None) or [],
            engine=request.app.state.engine,
            url_for=lambda name, slug: str(request.url_for(name, slug=slug)),
        )
    if language is None:
        if study is not None:
            language = language_of(study.settings)
        elif slug is not None:
            language = slug_language(slug, engine=request.app.state.engine)
    lang = supported_language(language)
    return templates.TemplateResponse(  # type: ignore[no-any-return]
        request,
        "pages/respondent_message.html",
        {
            "title": title.say(lang) if isinstance(title, Words) else title,
            "text": text.say(lang) if isinstance(text, Words) else text,
            "study": study,
            "detail": detail,
            "retry_url": retry_url,
            "respondent_language": lang,
        },
        status_code=status_code,
    )


def _invalid_link(
    request: Request, templates: Any, exc: InvalidInputError, study: Study
) -> HTMLResponse:
    """The refusal of a link whose parameters cannot be stored (422): what to do, then
    the parameter at fault in small print."""
    return message_page(
        request,
        templates,
        words("invalid_link.title"),
        words("invalid_link.text"),
        422,
        study,
        detail=exc.message,
    )


def _not_open(request: Request, templates: Any) -> HTMLResponse:
    return message_page(
        request, templates, words("not_open.title"), words("not_open.text"), status_code=404
    )


def _asked_attributes(rt: svc.StudyRuntime) -> int:
    """How many attribute questions the browser flow asks before the adaptive ones."""
    return len(rt.attributes) if rt.settings.ask_attributes else 0


def _progress(done: int, total: int, number: int) -> dict[str, Any]:
    """The progress line: ``number`` is the first question on the page, counting the
    questions about the respondent first; ``total`` the most questions in all."""
    total = max(total, 1)
    return {
        "done": done,
        "total": total,
        "number": number,
        "percent": round(100 * done / total),
    }


def _question_context(
    study: Study,
    view: svc.SessionView,
    *,
    n_attributes: int = 0,
    error: str | None = None,
    notice: str | None = None,
    resume_url: str | None = None,
) -> dict[str, Any]:
    number = n_attributes + (view.question.number if view.question else view.n_posed + 1)
    return {
        "study": study,
        "view": view,
        "q": view.question,
        "progress": _progress(
            n_attributes + view.n_posed, n_attributes + view.max_questions, number
        ),
        "idempotency_key": secrets.token_urlsafe(16),
        "error": error,
        "notice": notice,
        "resume_url": resume_url,
    }


# ----- pages --------------------------------------------------------------------------------


@router.get("/{slug}", response_class=HTMLResponse, name="respondent_start")
def start_page(
    slug: str,
    request: Request,
    visit: VisitDep,
    session: SessionDep,
    templates: TemplatesDep,
    settings: SettingsDep,
) -> Response:
    """The consent page (or straight to the current page when a session cookie exists);
    the "preparing" page while the study's first model is being fitted (a study without a
    model or fit job gets its first fit queued here), whose poll (``HX-Trigger:
    preparing``) gets 204 until then and ``HX-Refresh`` after."""
    study = visit.study
    if study is None:
        return _not_open(request, templates)
    readiness = (
        survey_readiness(study, session=session, queue_fit=settings)
        if visit.sess is None
        else "ready"
    )
    polled = request.headers.get("HX-Trigger") == "preparing"
    if readiness == "fit_failed":  # the researcher sees why on the study's Jobs page
        if polled:
            return Response(headers={"HX-Refresh": "true"})
        return message_page(
            request, templates, words("fit_failed.title"), words("fit_failed.text"), 503, study
        )
    if readiness == "preparing":
        if polled:
            return Response(status_code=204)
        return templates.TemplateResponse(
            request, "pages/respondent_preparing.html", {"study": study}
        )
    if polled:
        return Response(headers={"HX-Refresh": "true"})
    if visit.sess is not None:
        return _see(str(request.url_for("respondent_question", slug=slug)))
    params = request.query_params.multi_items()
    try:
        panel = (
            svc.clean_panel_params(_single_params(p for p in params if p[0] != LOST_PARAM)) or {}
        )
    except InvalidInputError as exc:
        return _invalid_link(request, templates, exc, study)
    lost = any(name == LOST_PARAM for name, _ in params)
    return templates.TemplateResponse(
        request, "pages/respondent_consent.html", {"study": study, "panel": panel, "lost": lost}
    )


def _single_params(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """``{name: value}`` of a link's parameters; a name given twice is refused (which of
    the two values is the panel's id cannot be known).

    Raises:
        InvalidInputError: naming the repeated parameter.
    """
    out: dict[str, str] = {}
    for key, value in pairs:
        if key in out:
            raise InvalidInputError(f"link parameter {key[:80]!r} is given twice")
        out[key] = value
    return out


@router.post("/{slug}/consent", name="respondent_consent")
async def consent(
    slug: str,
    request: Request,
    visit: VisitDep,
    session: SessionDep,
    engine: EngineDep,
    templates: TemplatesDep,
    settings: SettingsDep,
) -> Response:
    """Accept (create the respondent and session) or decline (nothing is stored).

    A browser that already has a session of the study (Back to the consent page) is sent
    to that session's current page, or the completion page, and never starts a second.
    """
    study = visit.study
    if study is None:
        return _not_open(request, templates)
    if survey_readiness(study, session=session) != "ready":  # never fit while one waits
        return _see(str(request.url_for("respondent_start", slug=slug)))
    form = await request.form()
    if form.get("choice") != "accept":
        return _see(str(request.url_for("respondent_declined", slug=slug)))
    if visit.sess is not None:
        return _see(str(request.url_for("respondent_question", slug=slug)))
    earlier = _earlier_starts(request, study, settings)
    try:
        panel = _single_params(
            (str(k)[len(PANEL_FIELD_PREFIX) :], str(v))
            for k, v in form.multi_items()
            if str(k).startswith(PANEL_FIELD_PREFIX)
        )
    except InvalidInputError as exc:
        return _invalid_link(request, templates, exc, study)
    settings_ = svc.study_settings(study)
    session.close()  # see app.routes.api_v1.release: one pooled connection per request at a time
    try:
        started = svc.start_session(
            study,
            engine=engine,
            panel_params=panel,
            ask_attributes=settings_.ask_attributes,
            earlier_starts=earlier,
        )
    except InvalidInputError as exc:  # the link parameters (svc.clean_panel_params)
        return _invalid_link(request, templates, exc, study)
    except PriorlyError as exc:
        return message_page(
            request,
            templates,
            words("cannot_start.title"),
            words("cannot_start.text", reason=exc.message),
            409,
            study,
        )
    response = _see(str(request.url_for("respondent_question", slug=slug)))
    _set_cookie(response, study, started.session_id, started.token, settings)
    _set_browser_cookie(response, study, earlier + 1, settings)
    return response


@router.get("/{slug}/declined", response_class=HTMLResponse, name="respondent_declined")
def declined(
    request: Request, visit: VisitDep, session: SessionDep, templates: TemplatesDep
) -> Response:
    """The page after declining: nothing stored, or (this browser has a session) what is
    stored and how to delete it."""
    study = visit.study
    if study is None:
        return _not_open(request, templates)
    if visit.sess is None:
        return message_page(
            request, templates, words("declined.heading"), words("declined.nothing"), study=study
        )
    stored = svc.stored_summary(visit.sess, session=session)
    return templates.TemplateResponse(
        request,
        "pages/respondent_declined.html",
        {"study": study, "stored": stored, "preview": visit.sess.is_preview},
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
            request, templates, words("link_invalid.title"), words("link_invalid.resume"), 404
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
    page = visit.page(request, templates, session, settings)
    if isinstance(page, Response):
        return page
    number = request.query_params.get("page", "")
    return page.render(attribute_page=int(number) if number.isdigit() and len(number) < 4 else None)


@router.post("/{slug}/about", name="respondent_about")
async def about(
    request: Request,
    visit: VisitDep,
    session: SessionDep,
    engine: EngineDep,
    templates: TemplatesDep,
    settings: SettingsDep,
) -> Response:
    """Store one page of questions about the respondent; then the next page, or (after the
    last page, or "skip them all") the first adaptive question.

    "Prefer not to answer" leaves an attribute out. A page submitted with nothing chosen
    asks once whether to skip all the remaining questions about the respondent (the
    ``skip_all`` button of that prompt does). A page with some questions left blank comes
    back once with its choices kept and the blank ones marked; "Continue" again
    (``blank_ok``) leaves them unanswered.
    """
    page = visit.page(request, templates, session, settings)
    if isinstance(page, Response):
        return page
    study, sess = page.study, page.sess
    if page.view().phase != "attributes":
        return _see(str(request.url_for("respondent_question", slug=study.slug)))
    form = await request.form()
    rt = svc.load_runtime(study, session=session, fit_if_missing=False)
    pages = svc.attribute_pages(rt)
    raw_page = str(form.get("page", "1") or "1")
    number = min(
        max(int(raw_page) if raw_page.isdigit() and len(raw_page) < 4 else 1, 1), len(pages) or 1
    )
    items = pages[number - 1] if pages else []
    try:
        values = {item.key: form_str(form, ATTRIBUTE_FIELD_PREFIX + item.key) for item in items}
    except InvalidInputError:
        return page.again(page.say("about.unreadable"), attribute_page=number)
    skip_all = form.get("skip_all") is not None and rt.allow_skip
    chosen = {k: v for k, v in values.items() if v}
    blank_ok = rt.allow_skip and form.get("blank_ok") is not None
    if not skip_all and not blank_ok and len(chosen) < len(values):
        if not rt.allow_skip:
            return page.again(page.say("about.answer_every"), attribute_page=number, chosen=chosen)
        if not chosen:
            return page.again(status_code=200, attribute_page=number, confirm_skip=True)
        return page.again(status_code=200, attribute_page=number, chosen=chosen)
    answers = {k: (v if v and v != "__skip__" else None) for k, v in values.items()}
    session.close()  # one pooled connection per request at a time
    try:
        stored = svc.store_attribute_page(study, sess.id or 0, answers, engine=engine)
        if number < len(pages) and not skip_all:
            if not page.htmx:
                url = request.url_for("respondent_question", slug=study.slug)
                return _see(f"{url}?page={number + 1}")
            return page.render(partial=True, attribute_page=number + 1)
        view = svc.submit_attributes(study, sess.id or 0, stored, engine=engine)
    except InvalidInputError as exc:
        return page.again(page.say("about.refused", reason=exc.message), attribute_page=number)
    return page.after_submit(view)


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
    page = visit.page(request, templates, session, settings)
    if isinstance(page, Response):
        return page
    form = await request.form()
    try:
        item_key = form_str(form, "item")
        skip = form.get("skip") is not None
        option = None if skip else form_str(form, "option")
        idem = form_str(form, "idempotency_key") or None
    except InvalidInputError:
        return page.again(page.say("question.unreadable"))
    if not skip and not option:
        view = page.view()
        return page.again(
            page.say("question.choose_or_skip" if view.allow_skip else "question.choose"),
            view=view,
        )
    session.close()  # one pooled connection per request at a time
    try:
        view = svc.submit_answer(
            page.study,
            page.sess.id or 0,
            item_key=item_key,
            option=option,
            idempotency_key=idem,
            engine=engine,
        )
    except (svc.AnswerConflictError, svc.NotCurrentQuestionError, svc.SessionClosedError):
        if not page.htmx:
            return _see(str(request.url_for("respondent_question", slug=slug)))
        return page.render(notice=page.say("question.already_answered"), partial=True)
    except InvalidInputError as exc:
        return page.again(page.say("question.refused", reason=exc.message))
    return page.after_submit(view)


@router.get("/{slug}/done", response_class=HTMLResponse, name="respondent_done")
def done(
    slug: str,
    request: Request,
    visit: VisitDep,
    session: SessionDep,
    templates: TemplatesDep,
    settings: SettingsDep,
) -> Response:
    """The completion page: the completion code the session got when it completed
    (:func:`app.session.session_completion_code`), if configured the redirect link, and
    with the study's ``show_learned`` setting what the survey learned about them."""
    got = visit.require_session(request, templates)
    if isinstance(got, Response):
        return got
    study, sess = got
    if sess.status != SessionStatus.completed.value:
        return _see(str(request.url_for("respondent_question", slug=slug)))
    code = svc.session_completion_code(study, sess, settings.secret_key.get_secret_value())
    learned = (
        learned_about(study, sess, session=session)
        if svc.study_settings(study).show_learned
        else None
    )
    return templates.TemplateResponse(
        request,
        "pages/respondent_done.html",
        {
            "study": study,
            "code": code,
            "redirect_url": completion_redirect(study, sess, code, session=session),
            "learned": learned,
            "preview": sess.is_preview,
            "code_deletes": svc.found_by_code(study, sess),
        },
    )


def get_fielded_study(slug: str, session: SessionDep) -> Study | None:
    """The study of ``/s/{slug}`` if it was ever open to respondents (published or closed:
    deletion stays possible after fieldwork), else ``None``."""
    fielded = frozenset({StudyStatus.published.value, StudyStatus.closed.value})
    return _study_in(slug, fielded, session)


FieldedStudyDep = Annotated[Study | None, Depends(get_fielded_study)]


def _delete_page(
    request: Request,
    templates: Any,
    study: Study,
    browser_session: ElicitationSession | None,
    *,
    error: str | None = None,
    status_code: int = 200,
    code: str = "",
    confirmed: bool = False,
) -> Response:
    """The deletion page; refused, it keeps the typed ``code`` and the tick box."""
    return templates.TemplateResponse(  # type: ignore[no-any-return]
        request,
        "pages/respondent_delete.html",
        {
            "study": study,
            "has_browser_session": browser_session is not None,
            "shared_code": bool(study.completion_code),
            "error": error,
            "code": code,
            "confirmed": confirmed,
        },
        status_code=status_code,
    )


@router.get("/{slug}/delete", response_class=HTMLResponse, name="respondent_delete")
def delete_page(
    request: Request,
    study: FieldedStudyDep,
    session: SessionDep,
    templates: TemplatesDep,
    settings: SettingsDep,
) -> Response:
    """The deletion request: the completion code, or this browser's own session."""
    if study is None:
        return _not_open(request, templates)
    return _delete_page(
        request, templates, study, _session_from_cookie(request, study, session, settings)
    )


@router.post("/{slug}/delete", name="respondent_delete_post")
async def delete_answers(
    request: Request,
    study: FieldedStudyDep,
    session: SessionDep,
    engine: EngineDep,
    templates: TemplatesDep,
    settings: SettingsDep,
) -> Response:
    """Erase the respondent named by the completion code (or this browser's session) with
    :func:`app.session.erase_respondent`; only the erasure record's counts remain."""
    if study is None:
        return _not_open(request, templates)
    form = await request.form()
    own = _session_from_cookie(request, study, session, settings)
    code = str(form.get("code", "") or "")[:64]
    language = language_of(study.settings)
    if form.get("confirm") != "yes":
        return _delete_page(
            request,
            templates,
            study,
            own,
            error=respondent_text.text(language, "delete.error_confirm"),
            status_code=422,
            code=code,
        )
    target: ElicitationSession | None = own
    if form.get("use_browser") is None or own is None:
        target = svc.session_by_completion_code(
            study, code, settings.secret_key.get_secret_value(), session=session
        )
    if target is None:
        error = respondent_text.text(
            language, "delete.error_shared_code" if study.completion_code else "delete.error_code"
        )
        return _delete_page(
            request, templates, study, own, error=error, status_code=422, code=code, confirmed=True
        )
    session.close()  # one pooled connection per request at a time
    try:
        result = svc.erase_respondent(target, engine=engine)
    except svc.SessionNotFoundError:
        result = None
    response = message_page(
        request,
        templates,
        words("deleted.title"),
        erased_text(result, language) if result is not None else words("deleted.already"),
        study=study,
    )
    if own is not None and (own.id == target.id):
        response.delete_cookie(_cookie_name(study), path=f"/s/{study.slug}")
    return response
