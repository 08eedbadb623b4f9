"""Version drift: findings, the daemon's drift drains, and scans.

A branch off ``0001`` (the store upgrades to every head). Must stay in step
with ``b300.store.drift_tables``.

Revision ID: 0101
Revises: 0001
Create Date: 2026-11-29 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0101"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _utc(name: str, *, nullable: bool = False) -> sa.Column[Any]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "drift_finding",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("probe", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("expected", sa.Text(), nullable=False),
        sa.Column("found", sa.Text(), nullable=False),
        sa.Column("policy", sa.String(8), nullable=False),
        _utc("opened_at"),
        _utc("closed_at", nullable=True),
    )
    # "Open findings" (closed_at IS NULL), optionally of one node.
    op.create_index("ix_drift_finding_closed_at_node", "drift_finding", ["closed_at", "node"])
    op.create_table(
        "drift_drain",
        sa.Column("node", sa.String(255), primary_key=True),
        sa.Column("reason", sa.Text(), nullable=False),
        _utc("drained_at"),
    )
    op.create_table(
        "drift_scan",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        _utc("started_at"),
        _utc("finished_at"),
        sa.Column("nodes_scanned", sa.Integer(), nullable=False),
        sa.Column("matrix", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("drift_scan")
    op.drop_table("drift_drain")
    op.drop_index("ix_drift_finding_closed_at_node", table_name="drift_finding")
    op.drop_table("drift_finding")
