"""Attempt outcome: how recovery classified an attempt's end, and the evidence.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 19:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempt") as batch:
        batch.add_column(sa.Column("outcome", sa.String(32), nullable=True))
        batch.add_column(sa.Column("evidence", sa.Text(), nullable=True))
    op.create_index("ix_event_node", "event", ["node"])


def downgrade() -> None:
    op.drop_index("ix_event_node", table_name="event")
    with op.batch_alter_table("attempt") as batch:
        batch.drop_column("evidence")
        batch.drop_column("outcome")
