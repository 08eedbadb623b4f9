"""The ``[spares]`` section: which partitions get a daemon-held spare pool, and how big.

::

    [spares]
    enabled = true            # default false: no reservation is ever made
    refill_interval_s = 30.0  # how often the pools are checked and refilled (at most once a cycle)
    user = ""                 # the reservation's Users= (default: the user b300d runs as)

    [[spares.pool]]
    partition = "gpu"
    nodes = 2                 # idle healthy nodes the reservation keeps (K)

Each pool is the reservation ``b300-spares-<partition>``; see docs/design/spares.md
("The daemon-held spare pool").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, model_validator

from ..errors import ConfigError
from ..grammar.types import GROUP, NAME, Table, matches, validate

PREFIX = "b300-spares-"


def reservation_name(partition: str) -> str:
    """The reservation that is the pool of ``partition``."""
    return f"{PREFIX}{partition}"


class PoolTable(Table):
    """One partition's pool."""

    #: The partition whose idle healthy nodes the pool holds.
    partition: Annotated[str, matches(NAME, "a partition name (letters, digits, '.', '_', '-')")]
    #: Idle healthy nodes to keep in the reservation.
    nodes: int = Field(ge=1, le=4096)

    @property
    def reservation(self) -> str:
        return reservation_name(self.partition)


class SparesConfig(Table):
    """``[spares]``; off unless ``enabled`` and at least one ``[[spares.pool]]``."""

    #: false (the default): no reservation is ever made.
    enabled: bool = False
    #: How often the pools are checked and refilled (at most once a cycle).
    refill_interval_s: float = Field(default=30.0, ge=1.0, le=3600.0)
    #: The reservation's Users= (default: the user b300d runs as).
    user: Annotated[str, matches(GROUP, "a user name", empty=True)] = ""
    #: One [[spares.pool]] per partition: the reservation b300-spares-<partition>.
    pool: list[PoolTable] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_pool_per_partition(self) -> SparesConfig:
        seen: set[str] = set()
        for p in self.pool:
            if p.partition in seen:
                raise ValueError(f"[spares] pool: partition {p.partition!r} has two pools")
            seen.add(p.partition)
        if self.enabled and not self.pool:
            raise ValueError("[spares] enabled needs at least one [[spares.pool]] "
                             "(partition = \"...\", nodes = K)")
        return self

    @property
    def pools(self) -> tuple[PoolTable, ...]:
        """The pools in force: none unless enabled."""
        return tuple(self.pool) if self.enabled else ()

    def pool_for(self, partition: str | None) -> PoolTable | None:
        return next((p for p in self.pools if p.partition == partition), None)


def load_spares_config(table: Mapping[str, Any] | None, where: str = "config") -> SparesConfig:
    """The config from a parsed ``[spares]`` table (None: off); ConfigError with one line
    naming the key (:func:`b300.grammar.types.validate`)."""
    return validate(SparesConfig, dict(table or {}), where, ConfigError, prefix=("spares",))
