"""SQLite: respondent and session ids are never reused (``AUTOINCREMENT``).

Without it SQLite gives a new row the largest id + 1, so after the newest respondent is
erased the next one gets its id (and the next session its session id): an API client that
keys its users or its erasure log by those ids would mix two people up. The two tables are
rebuilt with ``AUTOINCREMENT`` (a batch copy; migrations run with foreign-key enforcement
off, so the copy cascades nothing); SQLite then remembers the largest id ever given,
including those of the copied rows. PostgreSQL's sequences never reuse an id: nothing to do.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 14:50:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("respondent", "elicitation_session")


def _rebuild(autoincrement: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in TABLES:
        with op.batch_alter_table(
            table, recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}
        ):
            pass


def upgrade() -> None:
    _rebuild(True)


def downgrade() -> None:
    _rebuild(False)
