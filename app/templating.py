"""Jinja2 templates: pages extend ``base.html``; partials are rendered as named blocks.

``Jinja2Blocks`` (jinja2-fragments) renders either a whole template or one of its blocks
(``block_name=...``), so an htmx partial and its full page share one template. Autoescape
is always on: study texts, persona text and LLM output are untrusted.

The respondent pages take their words from :mod:`app.respondent_text` through the globals
:func:`t`, :func:`page_language` and :func:`script_messages`, in the language of the page
(:func:`page_language`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jinja2 import pass_context
from jinja2.runtime import Context
from jinja2_fragments.fastapi import Jinja2Blocks
from markupsafe import Markup

from app import respondent_text

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"
STATIC_DIR = Path(__file__).resolve().parent.parent / "static"


def make_templates(directory: Path = TEMPLATES_DIR) -> Jinja2Blocks:
    """The template renderer (autoescape on for every template, whatever its suffix), with
    the globals :func:`kept`, :func:`kept_checked`, :func:`t`, :func:`page_language` and
    :func:`script_messages`."""
    templates = Jinja2Blocks(directory=str(directory))
    templates.env.autoescape = True
    templates.env.globals["kept"] = kept
    templates.env.globals["kept_checked"] = kept_checked
    templates.env.globals["t"] = t
    templates.env.globals["page_language"] = page_language
    templates.env.globals["script_messages"] = script_messages
    return templates


@pass_context
def page_language(ctx: Context) -> str:
    """The language of a respondent page: ``respondent_language`` of the context when
    given (a page that knows no study), else the setting of the context's ``study``, else
    English. Example: ``<html lang="{{ page_language() }}">``."""
    given = ctx.get("respondent_language")
    if given:
        return respondent_text.supported_language(given)
    return respondent_text.language_of(getattr(ctx.get("study"), "settings", None))


@pass_context
def t(ctx: Context, key: str, **params: Any) -> str | Markup:
    """Message ``key`` of :mod:`app.respondent_text` in the page's language with ``params``
    filled in. A plain text is escaped when it is output; a ``..._html`` message is markup
    whose parameters are escaped here.

    Example: ``{{ t("progress.question", number=3, total=10) }}``;
    ``{{ t("done.delete_code_html", url=url_for(...)) }}``."""
    language = page_language(ctx)
    if key.endswith("_html"):
        count = params.get("count")
        raw = respondent_text.pattern(language, key, count if isinstance(count, int) else None)
        return Markup(raw).format(**params)
    return respondent_text.text(language, key, **params)


@pass_context
def script_messages(ctx: Context, several: bool = False) -> dict[str, str]:
    """:func:`app.respondent_text.script_messages` in the page's language, for a form's
    ``data-messages='{{ script_messages()|tojson }}'``."""
    return respondent_text.script_messages(page_language(ctx), several=several)


def _posted(ctx: Context, form: str) -> dict[str, str] | None:
    posted = ctx.get("posted")
    return posted if posted is not None and ctx.get("posted_to") == form else None


@pass_context
def kept(ctx: Context, form: str, name: str, default: Any) -> Any:
    """The value to show in field ``name`` of the form posted to ``.../{form}``: what was
    typed when that form was just refused (``posted``, see
    :func:`app.routes.admin.common.render`), else ``default`` (the stored value).

    Example: ``<input name="max_questions" value="{{ kept('settings', 'max_questions',
    settings.budgets.max_questions) }}">``."""
    posted = _posted(ctx, form)
    return posted[name] if posted is not None and name in posted else default


@pass_context
def kept_checked(ctx: Context, form: str, name: str, default: bool) -> bool:
    """Whether checkbox ``name`` shows checked: as posted when the form was just refused
    (an unchecked box is not posted), else ``default``."""
    posted = _posted(ctx, form)
    return name in posted if posted is not None else default
