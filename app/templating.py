"""Jinja2 templates: pages extend ``base.html``; partials are rendered as named blocks.

``Jinja2Blocks`` (jinja2-fragments) renders either a whole template or one of its blocks
(``block_name=...``), so an htmx partial and its full page share one template. Autoescape
is always on: study texts, persona text and LLM output are untrusted.
"""

from __future__ import annotations

from pathlib import Path

from jinja2_fragments.fastapi import Jinja2Blocks

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"
STATIC_DIR = Path(__file__).resolve().parent.parent / "static"


def make_templates(directory: Path = TEMPLATES_DIR) -> Jinja2Blocks:
    """The template renderer (autoescape on for every template, whatever its suffix)."""
    templates = Jinja2Blocks(directory=str(directory))
    templates.env.autoescape = True
    return templates
