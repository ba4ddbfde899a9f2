"""Jinja2 templates: pages extend ``base.html``; partials are rendered as named blocks.

``Jinja2Blocks`` (jinja2-fragments) renders either a whole template or one of its blocks
(``block_name=...``), so an htmx partial and its full page share one template. Autoescape
is always on: study texts, persona text and LLM output are untrusted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jinja2 import pass_context
from jinja2.runtime import Context
from jinja2_fragments.fastapi import Jinja2Blocks

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"
STATIC_DIR = Path(__file__).resolve().parent.parent / "static"


def make_templates(directory: Path = TEMPLATES_DIR) -> Jinja2Blocks:
    """The template renderer (autoescape on for every template, whatever its suffix), with
    the globals :func:`kept` and :func:`kept_checked`."""
    templates = Jinja2Blocks(directory=str(directory))
    templates.env.autoescape = True
    templates.env.globals["kept"] = kept
    templates.env.globals["kept_checked"] = kept_checked
    return templates


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
