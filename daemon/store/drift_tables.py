"""SQLModel table classes of version drift (storage layer only; see ``tables.py``).

The schema is owned by the Alembic revision ``0101`` (a branch off ``0001``);
these classes must describe the same tables, which ``tests/test_store.py``
checks. Imported by ``b300.store`` so that they are part of ``METADATA``.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from .tables import _utc_column


class DriftFindingRow(SQLModel, table=True):
    """One finding of a drift scan; open while ``closed_at`` is NULL."""

    __tablename__ = "drift_finding"
    __table_args__ = (sa.Index("ix_drift_finding_closed_at_node", "closed_at", "node"),)

    id: int | None = Field(
        default=None, sa_column=sa.Column(sa.Integer(), primary_key=True, autoincrement=True)
    )
    node: str = Field(sa_column=sa.Column(sa.String(255), nullable=False))
    probe: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    kind: str = Field(sa_column=sa.Column(sa.String(16), nullable=False))
    expected: str = Field(sa_column=sa.Column(sa.Text(), nullable=False))
    found: str = Field(sa_column=sa.Column(sa.Text(), nullable=False))
    policy: str = Field(sa_column=sa.Column(sa.String(8), nullable=False))
    opened_at: datetime = Field(sa_column=_utc_column())
    closed_at: datetime | None = Field(default=None, sa_column=_utc_column(nullable=True))


class DriftDrainRow(SQLModel, table=True):
    """A node the daemon drained for drift (so that it may resume it, and only it)."""

    __tablename__ = "drift_drain"

    node: str = Field(sa_column=sa.Column(sa.String(255), primary_key=True))
    reason: str = Field(sa_column=sa.Column(sa.Text(), nullable=False))
    drained_at: datetime = Field(sa_column=_utc_column())


class DriftScanRow(SQLModel, table=True):
    """One scan; ``matrix`` is JSON: the latest known row of every node, by node name."""

    __tablename__ = "drift_scan"

    id: int | None = Field(
        default=None, sa_column=sa.Column(sa.Integer(), primary_key=True, autoincrement=True)
    )
    started_at: datetime = Field(sa_column=_utc_column())
    finished_at: datetime = Field(sa_column=_utc_column())
    nodes_scanned: int = Field(sa_column=sa.Column(sa.Integer(), nullable=False))
    matrix: str = Field(sa_column=sa.Column(sa.Text(), nullable=False))
