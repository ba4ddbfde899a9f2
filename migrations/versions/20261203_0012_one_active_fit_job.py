"""One queued or running ``fit_model`` job per study: a partial unique index on
``job(study_id)`` where ``kind = 'fit_model'`` and the status is queued or running, so two
"Refit now" clicks (or two completing respondents) at the same moment cannot queue two fits;
:func:`app.services.jobs.start_job` turns the refused insert into the existing job.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 08:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WHERE = "kind = 'fit_model' AND status IN ('queued', 'running')"


def upgrade() -> None:
    # Rows from before the index: keep the newest active fit of a study, cancel the others.
    op.execute(
        "UPDATE job SET status = 'cancelled', message = 'cancelled: a newer fit job is queued' "
        f"WHERE {WHERE} AND id NOT IN (SELECT max(id) FROM job WHERE {WHERE} GROUP BY study_id)"
    )
    op.create_index(
        "uq_job_one_active_fit",
        "job",
        ["study_id"],
        unique=True,
        sqlite_where=sa.text(WHERE),
        postgresql_where=sa.text(WHERE),
    )


def downgrade() -> None:
    op.drop_index("uq_job_one_active_fit", table_name="job")
