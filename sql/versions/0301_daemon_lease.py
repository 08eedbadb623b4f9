"""High availability: the daemons' lease row, and which daemon wrote each event.

``daemon_lease`` holds one row per lease name: who holds it (identity, host,
pid), its ``epoch`` (the fencing token, +1 at every change of holder) and
``expires_at``, judged by the database server's clock. ``event.daemon`` names
the daemon (and its epoch) that appended the event.

Revision ID: 0301
Revises: 0002, 0101, 0321
Create Date: 2026-12-01 09:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0301"
# Also merges the schema's branches into one head.
down_revision: str | Sequence[str] | None = ("0002", "0101", "0321")
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "daemon_lease",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("holder", sa.String(200), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("renewed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    with op.batch_alter_table("event") as batch:
        batch.add_column(sa.Column("daemon", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("event") as batch:
        batch.drop_column("daemon")
    op.drop_table("daemon_lease")
