"""Respondent ``earlier_starts``: how many respondents the same browser had started in the
study before this one (a repeated start from one browser is shown to the researcher).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 03:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("respondent", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("earlier_starts", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("respondent", schema=None) as batch_op:
        batch_op.drop_column("earlier_starts")
