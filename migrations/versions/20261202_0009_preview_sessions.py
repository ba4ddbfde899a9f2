"""Preview sessions: ``elicitation_session.is_preview`` marks a researcher's "preview as
respondent" run, which dashboards and exports leave out (false for every existing row).

A plain ``ADD COLUMN`` with a server default on both backends (no table rebuild).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 03:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "elicitation_session",
        sa.Column("is_preview", sa.Boolean(), server_default=sa.false(), nullable=False),
    )


def downgrade() -> None:
    with op.batch_alter_table("elicitation_session", schema=None) as batch_op:
        batch_op.drop_column("is_preview")
