"""Persona attributes: ``study_persona.attributes`` holds the attribute profile
(``{item key: option letter}``) of a persona built from attribute shares or an imported
respondent, so the persona prior conditions on a respondent's attribute answers
(``{}`` for every existing row and for free-text personas).

A plain ``ADD COLUMN`` with a server default on both backends (no table rebuild).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 05:45:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "study_persona",
        sa.Column("attributes", sa.JSON(), server_default=sa.text("'{}'"), nullable=False),
    )


def downgrade() -> None:
    with op.batch_alter_table("study_persona", schema=None) as batch_op:
        batch_op.drop_column("attributes")
