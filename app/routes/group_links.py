"""A group round member's personal link ``/g/{token}``: the round's one question.

The page is the respondent question page (``pages/respondent_question.html``, posting back
here); the answer goes through :func:`app.services.round_links.answer_round`, i.e. the
respondent answer path of :mod:`app.session`; a posted ``item`` other than the link's
question is refused (409, the question page again). A plain POST answers with a 303
to the link's page; with htmx (``HX-Request``) with an ``HX-Redirect`` to it. A closed
round refuses answers with 409 and says so; so does a study that is not published (closed
by its researcher while the round is open: the link is still genuine, and works again once
the study is published again); an unknown link is a 404 page. A member who has answered
sees "thank you" in every case, also on a second device whose page was shown before the
answer (its post is refused with a respondent's words, nothing stored).
"""

from __future__ import annotations

import secrets
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app import session as svc
from app.deps import EngineDep, SessionDep, TemplatesDep, form_str
from app.errors import InvalidInputError, PriorlyError
from app.respondent_text import language_of, text, words
from app.routes.respondent import NoStoreRoute, message_page
from app.services import group_rounds as rounds
from app.services import round_links
from app.tables import StudyStatus

router = APIRouter(prefix="/g", include_in_schema=False, route_class=NoStoreRoute)


def _closed(request: Request, templates: Any, link: round_links.MemberLink) -> HTMLResponse:
    return message_page(
        request,
        templates,
        words("round.closed_title"),
        words("round.closed_text", number=link.round_number),
        409,
        link.study,
    )


def _paused(request: Request, templates: Any, link: round_links.MemberLink) -> HTMLResponse:
    """409: the link is genuine but its study is not published (the researcher closed it)."""
    return message_page(
        request,
        templates,
        words("round.paused_title"),
        words("round.paused_text"),
        409,
        link.study,
    )


def _unknown(request: Request, templates: Any) -> HTMLResponse:
    return message_page(
        request, templates, words("link_invalid.title"), words("link_invalid.member"), 404
    )


def _question_page(
    request: Request,
    templates: Any,
    link: round_links.MemberLink,
    view: svc.SessionView,
    token: str,
    *,
    error: str | None = None,
    status_code: int = 200,
) -> HTMLResponse:
    return templates.TemplateResponse(  # type: ignore[no-any-return]
        request,
        "pages/respondent_question.html",
        {
            "study": link.study,
            "view": view,
            "q": view.question,
            "progress": {"done": 0, "total": 1, "percent": 0},
            "idempotency_key": secrets.token_urlsafe(16),
            "error": error,
            "notice": None,
            "resume_url": None,
            "answer_url": str(request.url_for("group_round_link", token=token)),
            "one_question": True,  # no "Question 1 of at most 1"; "Submit answer"
        },
        status_code=status_code,
    )


THANKS = {
    True: "round.thanks_skipped",
    False: "round.thanks_answered",
    None: "round.thanks_recorded",
}
"""The thank-you message after a skip, an answer, or a later visit of an answered link."""


def _thanks(
    request: Request, templates: Any, link: round_links.MemberLink, skipped: bool | None = None
) -> HTMLResponse:
    return message_page(
        request, templates, words("done.heading"), words(THANKS[skipped]), 200, link.study
    )


def get_member_link(token: str, session: SessionDep) -> round_links.MemberLink | None:
    """The member link ``/g/{token}``, whatever its study's status, else ``None``
    (the pages check the status: :func:`_is_paused`)."""
    try:
        return round_links.member_by_token(token, session=session)
    except PriorlyError:
        return None


def _is_paused(link: round_links.MemberLink) -> bool:
    """Whether the link's study takes no answers now (not published: closed)."""
    return link.study.status != StudyStatus.published.value


MemberLinkDep = Annotated[round_links.MemberLink | None, Depends(get_member_link)]


@router.get("/{token}", response_class=HTMLResponse, name="group_round_link")
def link_page(
    token: str, request: Request, link: MemberLinkDep, session: SessionDep, templates: TemplatesDep
) -> Response:
    """The round question, or "thank you" once answered, or "paused" (the study is
    closed), or "closed" (the round is)."""
    if link is None:
        return _unknown(request, templates)
    view = round_links.link_view(link, session=session)
    if view.n_posed >= 1:
        reply = request.query_params.get("reply")  # set by the redirect after the POST
        return _thanks(request, templates, link, {"skipped": True, "answered": False}.get(reply))
    if _is_paused(link):
        return _paused(request, templates, link)
    if not link.round_open or view.question is None:
        return _closed(request, templates, link)
    return _question_page(request, templates, link, view, token)


@router.post("/{token}")
async def link_answer(
    token: str,
    request: Request,
    link: MemberLinkDep,
    session: SessionDep,
    engine: EngineDep,
    templates: TemplatesDep,
) -> Response:
    """Store the answer (or "prefer not to answer" with ``skip``) and show the result."""
    if link is None:
        return _unknown(request, templates)
    form = await request.form()
    language = language_of(link.study.settings)

    def refused(error: str, status_code: int) -> HTMLResponse:
        """Nothing stored: "thank you" when the member has answered already, "paused"
        when the study is closed, "closed" when the round is, else the question again
        with ``error``."""
        view = round_links.link_view(link, session=session)
        if view.n_posed >= 1:
            return _thanks(request, templates, link)
        if _is_paused(link):
            return _paused(request, templates, link)
        if not link.round_open or view.question is None:
            return _closed(request, templates, link)
        return _question_page(
            request, templates, link, view, token, error=error, status_code=status_code
        )

    try:
        skip = form_str(form, "skip") == "1"
        option = form_str(form, "option")
        idem = form_str(form, "idempotency_key")
        item = form_str(form, "item")
    except InvalidInputError:
        return refused(text(language, "question.unreadable"), 422)
    if item and item != link.item_key:
        return refused(text(language, "round.other_question"), 409)
    if not skip and not option:
        return refused(text(language, "question.choose"), 422)
    if _is_paused(link):
        return refused("", 409)  # "thank you" or "paused": nothing is stored
    try:
        round_links.answer_round(
            link,
            option=None if skip else option,
            idempotency_key=idem or None,
            engine=engine,
        )
    except rounds.RoundClosedError:
        return _closed(request, templates, link)
    except svc.InvalidAnswerError as exc:
        return refused(text(language, "question.refused", reason=exc.message), 422)
    except svc.AnswerConflictError:
        # a round session holds one answer: another page (a second device, a stale tab)
        # posted after it; the stored answer, item keys and sessions are not for members
        return message_page(
            request,
            templates,
            words("round.already_title"),
            words("round.already_text"),
            409,
            link.study,
        )
    url = str(request.url_for("group_round_link", token=token))
    url += "?reply=" + ("skipped" if skip else "answered")
    if request.headers.get("HX-Request") == "true":
        return Response(status_code=200, headers={"HX-Redirect": url})
    return RedirectResponse(url, status_code=303)
