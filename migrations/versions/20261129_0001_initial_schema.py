"""Initial schema.

Studies, items, respondents (with their historical answers), sessions, answers, selection
decisions, fitted models and jobs.

Hand-checked: every foreign key has an index; constraint names follow
app.tables.NAMING_CONVENTION; CHECK constraints mirror the status / role enums.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "study",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("slug", sa.String(length=100), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("consent_text", sa.Text(), nullable=False),
        sa.Column("completion_code", sa.String(length=100), nullable=True),
        sa.Column("redirect_url", sa.String(length=2000), nullable=True),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("benchmark_runs", sa.JSON(), nullable=False),
        sa.Column("source", sa.Text(), nullable=True),
        sa.Column("license", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "status IN ('draft', 'published', 'closed')", name=op.f("ck_study_status_valid")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_study")),
        sa.UniqueConstraint("slug", name=op.f("uq_study_slug")),
    )
    op.create_table(
        "fitted_model",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("family", sa.String(length=64), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.Column("training_hash", sa.String(length=128), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("is_active", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["study.id"],
            name=op.f("fk_fitted_model_study_id_study"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fitted_model")),
    )
    op.create_index(op.f("ix_fitted_model_study_id"), "fitted_model", ["study_id"], unique=False)

    op.create_table(
        "item",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("topic", sa.String(length=200), nullable=True),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("is_preference_criterion", sa.Boolean(), nullable=False),
        sa.CheckConstraint(
            "role IN ('question', 'attribute', 'target')", name=op.f("ck_item_role_valid")
        ),
        sa.ForeignKeyConstraint(
            ["study_id"], ["study.id"], name=op.f("fk_item_study_id_study"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_item")),
        sa.UniqueConstraint("study_id", "key", name=op.f("uq_item_study_id_key")),
    )
    op.create_index(op.f("ix_item_study_id"), "item", ["study_id"], unique=False)

    op.create_table(
        "job",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')",
            name=op.f("ck_job_status_valid"),
        ),
        sa.ForeignKeyConstraint(
            ["study_id"], ["study.id"], name=op.f("fk_job_study_id_study"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job")),
    )
    op.create_index(op.f("ix_job_status"), "job", ["status"], unique=False)
    op.create_index(op.f("ix_job_study_id"), "job", ["study_id"], unique=False)

    op.create_table(
        "respondent",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("external_id", sa.String(length=200), nullable=True),
        sa.Column("attributes", sa.JSON(), nullable=False),
        sa.Column("answers", sa.JSON(), nullable=False),
        sa.Column("panel_params", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("split", sa.String(length=8), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("source IN ('import', 'live')", name=op.f("ck_respondent_source_valid")),
        sa.CheckConstraint(
            "split IS NULL OR split IN ('train', 'val', 'test')",
            name=op.f("ck_respondent_split_valid"),
        ),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["study.id"],
            name=op.f("fk_respondent_study_id_study"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_respondent")),
        sa.UniqueConstraint(
            "study_id", "external_id", name=op.f("uq_respondent_study_id_external_id")
        ),
    )
    op.create_index(op.f("ix_respondent_study_id"), "respondent", ["study_id"], unique=False)

    op.create_table(
        "elicitation_session",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("respondent_id", sa.Integer(), nullable=False),
        sa.Column("token_hash", sa.String(length=128), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("state", sa.LargeBinary(), nullable=True),
        sa.Column("state_version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('active', 'completed', 'declined', 'abandoned')",
            name=op.f("ck_elicitation_session_status_valid"),
        ),
        sa.ForeignKeyConstraint(
            ["respondent_id"],
            ["respondent.id"],
            name=op.f("fk_elicitation_session_respondent_id_respondent"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["study.id"],
            name=op.f("fk_elicitation_session_study_id_study"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_elicitation_session")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_elicitation_session_token_hash")),
    )
    op.create_index(
        op.f("ix_elicitation_session_respondent_id"),
        "elicitation_session",
        ["respondent_id"],
        unique=False,
    )
    op.create_index(
        op.f("ix_elicitation_session_study_id"), "elicitation_session", ["study_id"], unique=False
    )

    op.create_table(
        "answer",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.Integer(), nullable=False),
        sa.Column("item_id", sa.Integer(), nullable=False),
        sa.Column("option", sa.String(length=32), nullable=True),
        sa.Column("idempotency_key", sa.String(length=128), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["item_id"], ["item.id"], name=op.f("fk_answer_item_id_item"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["elicitation_session.id"],
            name=op.f("fk_answer_session_id_elicitation_session"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_answer")),
        sa.UniqueConstraint(
            "session_id", "idempotency_key", name=op.f("uq_answer_session_id_idempotency_key")
        ),
        sa.UniqueConstraint("session_id", "item_id", name=op.f("uq_answer_session_id_item_id")),
    )
    op.create_index(op.f("ix_answer_item_id"), "answer", ["item_id"], unique=False)
    op.create_index(op.f("ix_answer_session_id"), "answer", ["session_id"], unique=False)

    op.create_table(
        "selection_decision",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("item_id", sa.Integer(), nullable=True),
        sa.Column("criterion", sa.String(length=64), nullable=False),
        sa.Column("scores", sa.JSON(), nullable=False),
        sa.Column("stop_reason", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["item_id"],
            ["item.id"],
            name=op.f("fk_selection_decision_item_id_item"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["elicitation_session.id"],
            name=op.f("fk_selection_decision_session_id_elicitation_session"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_selection_decision")),
        sa.UniqueConstraint(
            "session_id", "position", name=op.f("uq_selection_decision_session_id_position")
        ),
    )
    op.create_index(
        op.f("ix_selection_decision_item_id"), "selection_decision", ["item_id"], unique=False
    )
    op.create_index(
        op.f("ix_selection_decision_session_id"), "selection_decision", ["session_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_selection_decision_session_id"), table_name="selection_decision")
    op.drop_index(op.f("ix_selection_decision_item_id"), table_name="selection_decision")

    op.drop_table("selection_decision")
    op.drop_index(op.f("ix_answer_session_id"), table_name="answer")
    op.drop_index(op.f("ix_answer_item_id"), table_name="answer")

    op.drop_table("answer")

    op.drop_index(op.f("ix_elicitation_session_study_id"), table_name="elicitation_session")
    op.drop_index(op.f("ix_elicitation_session_respondent_id"), table_name="elicitation_session")

    op.drop_table("elicitation_session")
    op.drop_index(op.f("ix_respondent_study_id"), table_name="respondent")

    op.drop_table("respondent")
    op.drop_index(op.f("ix_job_study_id"), table_name="job")
    op.drop_index(op.f("ix_job_status"), table_name="job")

    op.drop_table("job")
    op.drop_index(op.f("ix_item_study_id"), table_name="item")

    op.drop_table("item")
    op.drop_index(op.f("ix_fitted_model_study_id"), table_name="fitted_model")

    op.drop_table("fitted_model")
    op.drop_table("study")
