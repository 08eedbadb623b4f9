"""Checkpoints: the save time the daemon saw (first file to completion marker).

The Young/Daly advice (``b300ctl checkpoints``, ``status``, the weekly report
and the metrics) takes the median of a run's newest save times from here.

Revision ID: 0321
Revises: 0202
Create Date: 2026-12-01 09:50:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0321"
down_revision: str | Sequence[str] | None = "0202"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoint") as batch:
        batch.add_column(sa.Column("save_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoint") as batch:
        batch.drop_column("save_s")
