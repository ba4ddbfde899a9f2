"""What the respondent pages under ``/s/{slug}`` link to and say, beyond their templates:
the completion page's redirect link with its placeholders filled in, the words of a
deletion, the language of a survey address, and where "Try again" leads after too many
requests. The words themselves are in :mod:`app.respondent_text`.

Example::

    >>> fill_redirect(
    ...     "https://panel.example/done?cc={code}&pid={PROLIFIC_PID}&x={OTHER}",
    ...     "3F9A0C21B7",
    ...     {"PROLIFIC_PID": "pid ABC"},
    ... )
    'https://panel.example/done?cc=3F9A0C21B7&pid=pid%20ABC&x='
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from urllib.parse import quote, urlencode, urlsplit

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from app.errors import NotFoundError
from app.respondent_text import DEFAULT_LANGUAGE, language_of, listing, text
from app.services.studies import get_study_by_slug
from app.session import ErasureResult
from app.tables import ElicitationSession, Respondent, Study, StudyStatus

PLACEHOLDER = re.compile(r"\{([A-Za-z0-9_.\-]{1,64})\}")
"""A placeholder of the redirect URL: ``{NAME}`` with NAME a link parameter's name
(:data:`app.session.start.PANEL_KEY`, at most 64 characters) or ``code``."""


def fill_redirect(url: str | None, code: str, panel: Mapping[str, object] | None) -> str | None:
    """The redirect URL ``url`` with its placeholders filled in, URL-encoded: ``{code}``
    with the completion ``code``, ``{NAME}`` with the link parameter ``NAME`` the
    respondent arrived with (``respondent.panel_params``; the name is case-sensitive), and
    a ``{NAME}`` the respondent's link did not carry with nothing (``pid={PROLIFIC_PID}``
    becomes ``pid=``). ``{code}`` is always the completion code, even with a link
    parameter named ``code``. ``None`` without a URL, or when the filled URL is not
    http(s)."""
    if not url:
        return None
    params = {str(k): str(v) for k, v in (panel or {}).items()}

    def value(m: re.Match[str]) -> str:
        name = m.group(1)
        return quote(code if name == "code" else params.get(name, ""), safe="")

    filled = PLACEHOLDER.sub(value, url)
    return filled if urlsplit(filled).scheme in ("http", "https") else None


def completion_redirect(
    study: Study, sess: ElicitationSession, code: str, *, session: Session
) -> str | None:
    """The completion page's "Continue" link of ``sess``: the study's redirect URL filled
    in by :func:`fill_redirect` with ``code`` and the respondent's link parameters."""
    if not study.redirect_url:
        return None
    respondent = session.get(Respondent, sess.respondent_id)
    panel = respondent.panel_params if respondent is not None else None
    return fill_redirect(study.redirect_url, code, panel)


PANEL_FIELD_PREFIX = "p_"
"""The consent form's fields of the link parameters (``p_PROLIFIC_PID``)."""


def retry_after_limit(
    slug: str,
    path: str,
    form: Iterable[tuple[str, str]],
    *,
    engine: Engine,
    url_for: Callable[[str, str], str],
) -> tuple[Study | None, str | None]:
    """The published study of ``/s/{slug}`` and the "Try again" address of its page
    ``path`` refused for too many requests: after "I agree" (``.../consent``, whose refused
    ``form`` fields are given) the survey link again with its link parameters, after a
    deletion request the deletion page, else the respondent's current page. ``(None,
    None)`` when the study is not open. ``url_for(route name, slug)`` makes an address.

    Example: a refused ``POST /s/ces/consent`` with ``p_PROLIFIC_PID=pidABC`` gives
    ``(study, "http://host/s/ces?PROLIFIC_PID=pidABC")``.
    """
    try:
        with Session(engine) as db:
            study = get_study_by_slug(slug, session=db)
    except NotFoundError:
        return None, None
    if study.status != StudyStatus.published.value:
        return None, None
    if path.endswith("/consent"):
        params = [
            (k[len(PANEL_FIELD_PREFIX) :], v) for k, v in form if k.startswith(PANEL_FIELD_PREFIX)
        ]
        url = url_for("respondent_start", slug)
        return study, f"{url}?{urlencode(params)}" if params else url
    if path.endswith("/delete"):
        return study, url_for("respondent_delete", slug)
    return study, url_for("respondent_question", slug)


def slug_language(slug: str, *, engine: Engine) -> str:
    """The respondent pages' language of the study at ``/s/{slug}``, whatever its status
    (the "not available" page of a closed study is in its language); English when there
    is no such study or the database cannot tell."""
    try:
        with Session(engine) as db:
            return language_of(get_study_by_slug(slug, session=db).settings)
    except (NotFoundError, SQLAlchemyError):
        return DEFAULT_LANGUAGE


def erased_text(result: ErasureResult, language: str = DEFAULT_LANGUAGE) -> str:
    """What the deletion page says was deleted, in the words of the page that listed it
    (the declined page): answers to the survey questions, questions the respondent
    preferred not to answer, answers to the questions about them.

    Example: 2 answer rows (one a skip) and 8 attributes give "We deleted everything
    stored about you in this survey: 1 answer to the survey questions, 1 question you
    preferred not to answer and 8 answers to the questions about you. ..."
    """
    parts = [
        text(language, key, count=n)
        for n, key in (
            (result.n_answers - result.n_skipped, "count.answered"),
            (result.n_skipped, "count.skipped"),
            (result.n_attributes, "count.attributes"),
        )
        if n
    ]
    if not parts:
        return text(language, "deleted.nothing_answered")
    return text(language, "deleted.listed", listed=listing(language, parts))
