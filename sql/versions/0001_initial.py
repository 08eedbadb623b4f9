"""Initial schema: run, attempt, node and the append-only event log.

Written by hand (not from ``SQLModel.metadata``) so that later revisions are
plain diffs against it. Must stay in step with ``b300.store.tables``.

Revision ID: 0001
Revises:
Create Date: 2025-01-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _utc(name: str, *, nullable: bool = False) -> sa.Column[Any]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "run",
        sa.Column("id", sa.String(63), primary_key=True),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("spec_toml", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        _utc("created_at"),
        _utc("updated_at"),
    )
    op.create_table(
        "attempt",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "run_id",
            sa.String(63),
            sa.ForeignKey("run.id", name="fk_attempt_run_id"),
            nullable=False,
        ),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("tag", sa.String(100), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("slurm_job_id", sa.BigInteger(), nullable=True),
        sa.Column("nodes", sa.Text(), nullable=False),
        sa.Column("excluded_nodes", sa.Text(), nullable=False),
        sa.Column("resume_from", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("signal", sa.Integer(), nullable=True),
        _utc("started_at", nullable=True),
        _utc("ended_at", nullable=True),
        _utc("created_at"),
        _utc("updated_at"),
        sa.UniqueConstraint("run_id", "number", name="uq_attempt_run_id_number"),
        sa.UniqueConstraint("tag", name="uq_attempt_tag"),
    )
    op.create_index("ix_attempt_run_id", "attempt", ["run_id"])
    op.create_index("ix_attempt_slurm_job_id", "attempt", ["slurm_job_id"])
    op.create_index("ix_attempt_state", "attempt", ["state"])
    op.create_table(
        "node",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("state", sa.String(64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        _utc("updated_at"),
    )
    op.create_table(
        "event",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        _utc("ts"),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(63), nullable=True),
        sa.Column("attempt_id", sa.Integer(), nullable=True),
        sa.Column("node", sa.String(255), nullable=True),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sqlite_autoincrement=True,
    )
    # Serves both "events of one run in id order" and plain run_id lookups.
    op.create_index("ix_event_run_id_id", "event", ["run_id", "id"])


def downgrade() -> None:
    op.drop_table("event")
    op.drop_table("node")
    op.drop_table("attempt")
    op.drop_table("run")
