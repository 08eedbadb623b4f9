"""SQLModel table classes of checkpoints and their replicas (storage layer only; see ``tables.py``).

The schema is owned by the Alembic revision ``0201`` (a branch off ``0001``);
these classes must describe the same tables, which ``tests/test_store.py``
checks. Imported by ``b300.store`` so that they are part of ``METADATA``.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from .tables import _utc_column


class CheckpointRow(SQLModel, table=True):
    """One checkpoint of a run as last listed, with its verification and retention marks.

    ``verified`` is NULL until the checkpoint was verified against its manifest.
    """

    __tablename__ = "checkpoint"
    __table_args__ = (
        sa.UniqueConstraint("run_id", "path", name="uq_checkpoint_run_id_path"),
        sa.Index("ix_checkpoint_run_id_step", "run_id", "step"),
    )

    id: int | None = Field(
        default=None, sa_column=sa.Column(sa.Integer(), primary_key=True, autoincrement=True)
    )
    run_id: str = Field(
        sa_column=sa.Column(sa.String(63), sa.ForeignKey("run.id", name="fk_checkpoint_run_id"),
                            nullable=False)
    )
    path: str = Field(sa_column=sa.Column(sa.String(1024), nullable=False))
    step: int = Field(sa_column=sa.Column(sa.BigInteger(), nullable=False))
    mtime: datetime = Field(sa_column=_utc_column())
    complete: bool = Field(sa_column=sa.Column(sa.Boolean(), nullable=False))
    size_bytes: int = Field(sa_column=sa.Column(sa.BigInteger(), nullable=False))
    files: int = Field(sa_column=sa.Column(sa.Integer(), nullable=False))
    # Seconds from its first file to its last as listed (revision 0321); NULL when unknown.
    save_s: float | None = Field(default=None, sa_column=sa.Column(sa.Float()))
    verified: bool | None = Field(default=None, sa_column=sa.Column(sa.Boolean()))
    verified_at: datetime | None = Field(default=None, sa_column=_utc_column(nullable=True))
    marked: bool = Field(default=False, sa_column=sa.Column(sa.Boolean(), nullable=False))
    deleted_at: datetime | None = Field(default=None, sa_column=_utc_column(nullable=True))
    updated_at: datetime = Field(sa_column=_utc_column())


class CheckpointReplicaRow(SQLModel, table=True):
    """A checkpoint's copy on one replication target; ``ok`` once copied and verified,
    ``pruned_at`` once the target's own retention deleted it."""

    __tablename__ = "checkpoint_replica"
    __table_args__ = (
        sa.UniqueConstraint("checkpoint_id", "target", name="uq_checkpoint_replica_checkpoint_id_target"),
    )

    id: int | None = Field(
        default=None, sa_column=sa.Column(sa.Integer(), primary_key=True, autoincrement=True)
    )
    checkpoint_id: int = Field(
        sa_column=sa.Column(
            sa.Integer(),
            sa.ForeignKey("checkpoint.id", name="fk_checkpoint_replica_checkpoint_id", ondelete="CASCADE"),
            nullable=False,
        )
    )
    target: str = Field(sa_column=sa.Column(sa.String(128), nullable=False))
    ok: bool = Field(sa_column=sa.Column(sa.Boolean(), nullable=False))
    bytes_sent: int = Field(default=0, sa_column=sa.Column(sa.BigInteger(), nullable=False))
    error: str = Field(default="", sa_column=sa.Column(sa.Text(), nullable=False))
    updated_at: datetime = Field(sa_column=_utc_column())
    pruned_at: datetime | None = Field(default=None, sa_column=_utc_column(nullable=True))  # rev 0202
