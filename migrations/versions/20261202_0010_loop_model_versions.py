"""Model versions of the learning loop: each ``fitted_model`` row records whether it was
promoted or rejected and why, its held-out score and that of the model active when it was
judged, and its training counts; ``elicitation_session.model_id`` records the model whose
states a session stores (sessions in progress keep it when another model is promoted).

Plain ``ADD COLUMN`` statements on both backends (nullable, or with a server default: no
table rebuild).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 06:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_MODEL_COLUMNS = (
    ("status", lambda: sa.Column("status", sa.String(length=16), nullable=True)),
    ("reason", lambda: sa.Column("reason", sa.String(length=500), nullable=True)),
    ("val_log_lik", lambda: sa.Column("val_log_lik", sa.Float(), nullable=True)),
    ("active_val_log_lik", lambda: sa.Column("active_val_log_lik", sa.Float(), nullable=True)),
    (
        "n_imported",
        lambda: sa.Column("n_imported", sa.Integer(), server_default="0", nullable=False),
    ),
    ("n_live", lambda: sa.Column("n_live", sa.Integer(), server_default="0", nullable=False)),
    (
        "n_validation",
        lambda: sa.Column("n_validation", sa.Integer(), server_default="0", nullable=False),
    ),
)


def upgrade() -> None:
    for _name, column in _MODEL_COLUMNS:
        op.add_column("fitted_model", column())
    op.add_column("elicitation_session", sa.Column("model_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("elicitation_session", schema=None) as batch_op:
        batch_op.drop_column("model_id")
    with op.batch_alter_table("fitted_model", schema=None) as batch_op:
        for name, _column in reversed(_MODEL_COLUMNS):
            batch_op.drop_column(name)
