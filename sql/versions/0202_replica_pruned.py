"""Checkpoint replicas: when a target's own retention pruned a replica.

A replica that was copied and verified and later pruned on the target by the
retention rules still counts as "was replicated" for the local prune, so
``ok`` stays true and ``pruned_at`` says it is gone.

Revision ID: 0202
Revises: 0201
Create Date: 2026-11-29 22:50:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0202"
down_revision: str | Sequence[str] | None = "0201"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoint_replica") as batch:
        batch.add_column(sa.Column("pruned_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoint_replica") as batch:
        batch.drop_column("pruned_at")
