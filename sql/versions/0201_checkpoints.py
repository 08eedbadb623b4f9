"""Checkpoints: what each run's layout listed, verification, marks, and offsite replicas.

A branch off ``0001`` (the store upgrades to every head). Must stay in step
with ``b300.store.checkpoint_tables``.

Revision ID: 0201
Revises: 0001
Create Date: 2026-11-29 19:40:00
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0201"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _utc(name: str, *, nullable: bool = False) -> sa.Column[Any]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "checkpoint",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(63), sa.ForeignKey("run.id", name="fk_checkpoint_run_id"),
                  nullable=False),
        sa.Column("path", sa.String(1024), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        _utc("mtime"),
        sa.Column("complete", sa.Boolean(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("verified", sa.Boolean(), nullable=True),
        _utc("verified_at", nullable=True),
        sa.Column("marked", sa.Boolean(), nullable=False),
        _utc("deleted_at", nullable=True),
        _utc("updated_at"),
        sa.UniqueConstraint("run_id", "path", name="uq_checkpoint_run_id_path"),
    )
    op.create_index("ix_checkpoint_run_id_step", "checkpoint", ["run_id", "step"])
    op.create_table(
        "checkpoint_replica",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("checkpoint_id", sa.Integer(),
                  sa.ForeignKey("checkpoint.id", name="fk_checkpoint_replica_checkpoint_id",
                                ondelete="CASCADE"),
                  nullable=False),
        sa.Column("target", sa.String(128), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("bytes_sent", sa.BigInteger(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        _utc("updated_at"),
        sa.UniqueConstraint("checkpoint_id", "target", name="uq_checkpoint_replica_checkpoint_id_target"),
    )


def downgrade() -> None:
    op.drop_table("checkpoint_replica")
    op.drop_index("ix_checkpoint_run_id_step", table_name="checkpoint")
    op.drop_table("checkpoint")
