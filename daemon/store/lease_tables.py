"""SQLModel table class of the daemons' lease (storage layer only; see ``tables.py``).

The schema is owned by the Alembic revision ``0301``; ``tests/test_store.py``
checks that this class describes the same table. Imported by ``b300.store`` so
that it is part of ``METADATA``; :mod:`b300.ha.lease` reads and writes it.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from .tables import _utc_column


class LeaseRow(SQLModel, table=True):
    """Who may act for a lease name, until when (database clock), under which epoch."""

    __tablename__ = "daemon_lease"

    name: str = Field(sa_column=sa.Column(sa.String(64), primary_key=True))
    holder: str = Field(sa_column=sa.Column(sa.String(200), nullable=False))
    host: str = Field(sa_column=sa.Column(sa.String(255), nullable=False))
    pid: int = Field(sa_column=sa.Column(sa.Integer(), nullable=False))
    epoch: int = Field(sa_column=sa.Column(sa.BigInteger(), nullable=False))
    acquired_at: datetime = Field(sa_column=_utc_column())
    renewed_at: datetime = Field(sa_column=_utc_column())
    expires_at: datetime = Field(sa_column=_utc_column())
