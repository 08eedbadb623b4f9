"""SQLModel table classes of the state store: the storage layer only.

Nothing outside ``b300.store`` sees these classes; :mod:`b300.store.sql_store`
converts rows to the frozen records of :mod:`b300.model` at its boundary.
The schema itself is owned by the Alembic migrations in ``b300.sql.versions``;
these classes must describe the same tables (``tests/test_store.py`` checks
that they match) but are never used to create them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlmodel import Field, SQLModel

from ..errors import UsageError
from ..model import Attempt, AttemptState, Event, NodeRecord, Run, RunState


class UTCDateTime(sa.types.TypeDecorator[datetime]):
    """A timestamp stored as UTC and always read back timezone-aware in UTC.

    PostgreSQL keeps the zone (``timestamptz``) but answers in the session's
    zone; SQLite stores text and drops the zone. Writing UTC and attaching
    UTC to naive values on read gives the same answer from both.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            # A naive time has no defined instant; storing it would silently
            # shift it by the host's offset when read as UTC.
            raise ValueError(f"naive datetime {value.isoformat()} given to the store")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def _utc_column(*, nullable: bool = False) -> Any:
    # A fresh Column per field: SQLAlchemy columns cannot be shared by tables.
    return sa.Column(UTCDateTime(), nullable=nullable)


class RunRow(SQLModel, table=True):
    """One logical training run (``b300.model.Run``)."""

    __tablename__ = "run"

    id: str = Field(sa_column=sa.Column(sa.String(63), primary_key=True))
    name: str = Field(sa_column=sa.Column(sa.String(255), nullable=False))
    spec_toml: str = Field(sa_column=sa.Column(sa.Text(), nullable=False))
    state: str = Field(sa_column=sa.Column(sa.String(16), nullable=False))
    created_at: datetime = Field(sa_column=_utc_column())
    updated_at: datetime = Field(sa_column=_utc_column())


class AttemptRow(SQLModel, table=True):
    """One Slurm attempt of a run (``b300.model.Attempt``).

    ``nodes`` and ``excluded_nodes`` are comma-separated host names (Slurm
    host names never contain commas); ``""`` is the empty list.
    """

    __tablename__ = "attempt"
    __table_args__ = (
        sa.UniqueConstraint("run_id", "number", name="uq_attempt_run_id_number"),
        sa.UniqueConstraint("tag", name="uq_attempt_tag"),
        sa.Index("ix_attempt_run_id", "run_id"),
        sa.Index("ix_attempt_slurm_job_id", "slurm_job_id"),
        sa.Index("ix_attempt_state", "state"),
    )

    id: int | None = Field(
        default=None, sa_column=sa.Column(sa.Integer(), primary_key=True, autoincrement=True)
    )
    run_id: str = Field(
        sa_column=sa.Column(
            sa.String(63), sa.ForeignKey("run.id", name="fk_attempt_run_id"), nullable=False
        )
    )
    number: int = Field(sa_column=sa.Column(sa.Integer(), nullable=False))
    tag: str = Field(sa_column=sa.Column(sa.String(100), nullable=False))
    state: str = Field(sa_column=sa.Column(sa.String(16), nullable=False))
    slurm_job_id: int | None = Field(default=None, sa_column=sa.Column(sa.BigInteger()))
    nodes: str = Field(default="", sa_column=sa.Column(sa.Text(), nullable=False))
    excluded_nodes: str = Field(default="", sa_column=sa.Column(sa.Text(), nullable=False))
    resume_from: str | None = Field(default=None, sa_column=sa.Column(sa.Text()))
    reason: str = Field(default="", sa_column=sa.Column(sa.Text(), nullable=False))
    exit_code: int | None = Field(default=None, sa_column=sa.Column(sa.Integer()))
    signal: int | None = Field(default=None, sa_column=sa.Column(sa.Integer()))
    # "start"/"end" are SQL keywords; these names need no quoting in psql.
    started_at: datetime | None = Field(default=None, sa_column=_utc_column(nullable=True))
    ended_at: datetime | None = Field(default=None, sa_column=_utc_column(nullable=True))
    created_at: datetime = Field(sa_column=_utc_column())
    updated_at: datetime = Field(sa_column=_utc_column())
    # How recovery classified the end (revision 0002); evidence is JSON text.
    outcome: str | None = Field(default=None, sa_column=sa.Column(sa.String(32)))
    evidence: str | None = Field(default=None, sa_column=sa.Column(sa.Text()))


class NodeRow(SQLModel, table=True):
    """The last known state of one cluster node (``b300.model.NodeRecord``)."""

    __tablename__ = "node"

    name: str = Field(sa_column=sa.Column(sa.String(255), primary_key=True))
    state: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    reason: str = Field(default="", sa_column=sa.Column(sa.Text(), nullable=False))
    updated_at: datetime = Field(sa_column=_utc_column())


class EventRow(SQLModel, table=True):
    """One entry of the append-only event log (``b300.model.Event``).

    ``run_id``/``attempt_id`` carry no foreign keys on purpose: the log records
    what was said, including about runs or jobs the store does not know (an
    orphan job found in Slurm, a rejected submission). ``data`` is JSON text.
    """

    __tablename__ = "event"
    __table_args__ = (
        sa.Index("ix_event_run_id_id", "run_id", "id"),
        sa.Index("ix_event_node", "node"),
        # Readers page through the log with ``after_id``; AUTOINCREMENT stops
        # SQLite from ever reusing an id, even if rows are deleted by hand.
        {"sqlite_autoincrement": True},
    )

    id: int | None = Field(
        default=None,
        sa_column=sa.Column(
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
    )
    ts: datetime = Field(sa_column=_utc_column())
    kind: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    run_id: str | None = Field(default=None, sa_column=sa.Column(sa.String(63)))
    attempt_id: int | None = Field(default=None, sa_column=sa.Column(sa.Integer()))
    node: str | None = Field(default=None, sa_column=sa.Column(sa.String(255)))
    actor: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    data: str = Field(default="{}", sa_column=sa.Column(sa.Text(), nullable=False))
    # The daemon (identity and lease epoch) that appended it (migration 0301).
    daemon: str | None = Field(default=None, sa_column=sa.Column(sa.String(200)))


# -- rows to records (the only way rows leave the storage layer) --------------


def join_nodes(names: Sequence[str]) -> str:
    """Node names as stored: comma-separated. UsageError for an empty name or one with ','."""
    if isinstance(names, str):
        # A str is a Sequence[str] too; "node01" would be stored as n,o,d,e,0,1.
        raise TypeError(f"expected a sequence of node names, got the string {names!r}")
    for name in names:
        if "," in name or not name:
            raise UsageError(f"invalid node name {name!r}")
    return ",".join(names)


def split_nodes(text: str) -> tuple[str, ...]:
    """The inverse of :func:`join_nodes`."""
    return tuple(name for name in text.split(",") if name)


def _utc(value: datetime) -> datetime:
    # A row just written still holds the caller's datetime, maybe in another zone.
    return value.astimezone(UTC)


def _utc_or_none(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC)


def to_run(row: RunRow, attempts_count: int) -> Run:
    """The record of a run row."""
    return Run(
        id=row.id,
        name=row.name,
        spec_toml=row.spec_toml,
        state=RunState(row.state),
        created_at=_utc(row.created_at),
        updated_at=_utc(row.updated_at),
        attempts_count=attempts_count,
    )


def to_attempt(row: AttemptRow) -> Attempt:
    """The record of a flushed attempt row."""
    assert row.id is not None  # assigned by the flush that precedes every conversion
    return Attempt(
        id=row.id,
        run_id=row.run_id,
        number=row.number,
        tag=row.tag,
        state=AttemptState(row.state),
        created_at=_utc(row.created_at),
        updated_at=_utc(row.updated_at),
        slurm_job_id=row.slurm_job_id,
        nodes=split_nodes(row.nodes),
        excluded_nodes=split_nodes(row.excluded_nodes),
        resume_from=row.resume_from,
        reason=row.reason,
        exit_code=row.exit_code,
        signal=row.signal,
        start=_utc_or_none(row.started_at),
        end=_utc_or_none(row.ended_at),
        outcome=row.outcome or "",
        evidence=json.loads(row.evidence) if row.evidence else {},
    )


def to_event(row: EventRow) -> Event:
    """The record of a flushed event row (``data`` parsed back from JSON)."""
    assert row.id is not None  # assigned by the flush that precedes every conversion
    return Event(
        id=row.id,
        ts=_utc(row.ts),
        kind=row.kind,
        run_id=row.run_id,
        attempt_id=row.attempt_id,
        node=row.node,
        actor=row.actor,
        data=json.loads(row.data),
        daemon=row.daemon,
    )


def to_node(row: NodeRow) -> NodeRecord:
    """The record of a node row."""
    return NodeRecord(
        name=row.name, state=row.state, reason=row.reason, updated_at=_utc(row.updated_at)
    )


#: Every table of the store, for tests comparing them with the migrations.
METADATA = SQLModel.metadata
