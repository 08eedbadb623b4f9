"""The ``[liveness]`` section: how often nodes in use are checked and when one is dead.

Durations are numbers of seconds (TOML ``interval_s = 1.0``) or the project's duration
strings (``interval_s = "2s"``; b300.grammar.duration: no unit under a second). The defaults and
the false-positive rate they give are derived in docs/design/liveness.md from the
measurements in docs/benchmarks.md ("Liveness checks").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..errors import ConfigError
from ..grammar.duration import duration_seconds
from ..grammar.types import validate


class LivenessConfig(BaseModel):
    """Thresholds of active failure detection; strict (no bool for a number), unknown keys refused.

    A node is *suspect* after ``misses_to_suspect`` primary checks in a row got no
    answer; it is *dead* once the confirmation check also failed and the primary
    stayed silent for ``confirm_window_s`` after it became suspect. Any answer in
    that window clears it. So a silence shorter than about
    ``(misses_to_suspect - 1) * interval_s + confirm_window_s`` never drains a node.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    #: Check the nodes of running attempts actively.
    enabled: bool = True
    #: The check of every node in use every interval: "icmp" (ICMP echo), "syn" (a
    #: half-open TCP handshake to the slurmd port: a RST is an answer) or "connect" (a full
    #: TCP connect to slurmd: a refused slurmd is a miss; slurmd logs two lines per check).
    primary: Literal["icmp", "syn", "connect"] = "icmp"
    #: The independent second check of a suspect node: "syn", "icmp", "connect", or
    #: "ssh" (an SSH round trip with [drift]'s keys and node list).
    confirm: Literal["syn", "icmp", "connect", "ssh"] = "syn"
    #: The port of the "syn" and "connect" checks; unset: each node's slurmd port (from Slurm).
    port: int | None = Field(default=None, ge=1, le=65535)
    #: Seconds between two primary checks of every node in use (one batch per interval).
    interval_s: float = Field(default=1.0, ge=0.2, le=60.0)
    #: A primary check without an answer after this many seconds is a miss (every check
    #: sends one packet, or one SYN: a value under 1 s keeps Linux from resending it).
    timeout_s: float = Field(default=0.8, gt=0.0, le=30.0)
    #: Misses in a row that make a node suspect (and start the confirmation check).
    misses_to_suspect: int = Field(default=3, ge=1, le=100)
    #: Seconds a suspect node has to answer either check before it is confirmed dead.
    confirm_window_s: float = Field(default=1.0, ge=0.0, le=600.0)
    #: Budget of one confirmation check (one SYN or echo; or SSH connect, host key, authentication).
    confirm_timeout_s: float = Field(default=1.5, gt=0.0, le=60.0)
    #: A node whose primary check misses but which answers the confirmation is
    #: confirmed again after this many seconds (it may die later).
    recheck_s: float = Field(default=30.0, gt=0.0, le=3600.0)
    #: At most this many connect checks in flight at once (file descriptors); the ICMP and
    #: SYN checks use one socket per round and allow at least 1,024 waiting answers.
    max_in_flight: int = Field(default=512, ge=1, le=65536)
    #: A round in which at least this fraction of the nodes went silent (and at least two
    #: of them) says more about the network (a partition, a switch, the login node's own
    #: link) than about the nodes: its silences are not counted, nothing is drained, and a
    #: ``liveness.partition`` event (an alert) names the silent nodes.
    mass_silence_fraction: float = Field(default=0.5, gt=0.0, le=1.0)

    @field_validator("interval_s", "timeout_s", "confirm_window_s", "confirm_timeout_s", "recheck_s",
                     mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        return duration_seconds(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _timeout_fits_interval(self) -> LivenessConfig:
        if self.primary == self.confirm:
            raise ValueError(f"confirm ({self.confirm!r}) must differ from primary ({self.primary!r}): "
                             "a node is dead only when two independent checks fail")
        if self.timeout_s >= self.interval_s:
            raise ValueError(f"timeout_s ({self.timeout_s:g}) must be shorter than interval_s "
                             f"({self.interval_s:g}): every check of a round ends before the next")
        return self


def load_liveness_config(table: Mapping[str, Any] | None, where: str = "config") -> LivenessConfig:
    """The config from a parsed ``[liveness]`` TOML table (None or {}: the defaults).

    Raises ConfigError with one line naming the key and the problem (the one error line of
    every config table, :func:`b300.grammar.types.validate`).
    """
    return validate(LivenessConfig, dict(table or {}), where, ConfigError, prefix=("liveness",))
