"""``elicitation_session.completion_code``: the completion code a session got when it
completed, so that a respondent who opens the end page again sees that code after the
researcher changed the study's fixed code: the study's fixed code at completion, ``''``
for the per-session derived code, NULL while the session is not completed.

The sessions completed before get the code they show now: the study's current fixed code,
``''`` without one. A plain ``ADD COLUMN`` of a nullable column on both backends (no table
rebuild); the downgrade's SQLite rebuild keeps ``AUTOINCREMENT`` (migration 0014).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "elicitation_session",
        sa.Column("completion_code", sa.String(length=100), nullable=True),
    )
    op.execute(
        "UPDATE elicitation_session SET completion_code = COALESCE((SELECT study.completion_code "
        "FROM study WHERE study.id = elicitation_session.study_id), '') "
        "WHERE status = 'completed'"
    )


def downgrade() -> None:
    with op.batch_alter_table(
        "elicitation_session", schema=None, table_kwargs={"sqlite_autoincrement": True}
    ) as batch_op:
        batch_op.drop_column("completion_code")
