"""``elicitation_session.asked_attributes``: whether the session asked the respondent the
study's attribute questions (the browser flow). An attribute missing from a respondent's
``attributes`` was declined only then; an API session that was given some attributes asked
none. NULL for the rows stored before (the study's ``ask_attributes`` setting decides, as
before).

A plain ``ADD COLUMN`` of a nullable column on both backends (no table rebuild).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03 14:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("elicitation_session", sa.Column("asked_attributes", sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("elicitation_session", schema=None) as batch_op:
        batch_op.drop_column("asked_attributes")
