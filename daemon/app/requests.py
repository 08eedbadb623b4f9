"""The control socket's requests, one model per op (pydantic: strict, unknown keys refused).

b300ctl (or anything else with access to the socket) sends one JSON object per
request: ``op``, the op's own fields, and ``deadline`` (Unix time after which the
client has given up). A request that does not fit its model is refused with one
line naming the field, exit code 2; it never reaches the daemon's parts.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import UsageError
from ..grammar.types import error_text
from ..model import is_node_name

Text = Annotated[str, Field(max_length=1 << 20)]


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    op: str
    deadline: float | int | None = None


class Ping(_Request):
    op: Literal["ping"]


class Wake(_Request):
    """A Slurm trigger (node down) or an operator asks for a cycle now."""

    op: Literal["wake"]
    why: Annotated[str, Field(max_length=4096)] = ""


class Submit(_Request):
    op: Literal["submit"]
    spec_toml: Text
    where: Annotated[str, Field(max_length=4096)] = "spec"


class Resubmit(_Request):
    op: Literal["resubmit"]
    run_id: Annotated[str, Field(max_length=64)]
    exclude: list[Annotated[str, Field(max_length=4096)]] = []
    resume_from: Annotated[str, Field(max_length=4096)] | None = None
    force: bool = False
    from_scratch: bool = False


class Cancel(_Request):
    op: Literal["cancel"]
    run_id: Annotated[str, Field(max_length=64)]


class NodeResume(_Request):
    op: Literal["node_resume"]
    node: str

    @field_validator("node")
    @classmethod
    def _node_name(cls, value: str) -> str:
        if not is_node_name(value):
            raise ValueError(f"bad node name {value!r}")
        return value


class DriftScan(_Request):
    op: Literal["drift_scan"]
    nodes: list[Annotated[str, Field(max_length=64)]] = []


class Status(_Request):
    """``b300ctl status``: one run (``run``), or the list (``all``: ended runs too)."""

    op: Literal["status"]
    run: Annotated[str, Field(max_length=4096)] | None = None  # an unknown one is "unknown run"
    all: bool = False


class CheckpointsPrune(_Request):
    """``b300ctl checkpoints RUN --prune --yes``; a retention option left out is the configured one."""

    op: Literal["checkpoints_prune"]
    run_id: Annotated[str, Field(max_length=64)]
    keep_last: int | None = None
    keep_hourly_for: Annotated[str, Field(max_length=64)] | None = None
    keep_daily_for: Annotated[str, Field(max_length=64)] | None = None


class Drill(_Request):
    """``b300ctl drill RUN``: pull a node out of the run's running attempt and measure."""

    op: Literal["drill"]
    run_id: Annotated[str, Field(max_length=64)]
    node: str | None = None
    method: Literal["down", "crash"] = "down"
    timeout_s: Annotated[float | int, Field(ge=1, le=3600)] = 600

    @field_validator("node")
    @classmethod
    def _node_name(cls, value: str | None) -> str | None:
        if value is not None and not is_node_name(value):
            raise ValueError(f"bad node name {value!r}")
        return value


class NodeTriage(_Request):
    """Triage a drained node now (``returnable``: a lemon may be returned again)."""

    op: Literal["node_triage"]
    node: str
    returnable: bool = False

    @field_validator("node")
    @classmethod
    def _node_name(cls, value: str) -> str:
        if not is_node_name(value):
            raise ValueError(f"bad node name {value!r}")
        return value


class DrillStatus(_Request):
    """A drill's record so far (read-only: anyone who may connect)."""

    op: Literal["drill_status"]
    drill: Annotated[int, Field(ge=1)]


#: Every op and its model; ``mutating`` ops change the world and are admin-only.
MODELS: dict[str, type[_Request]] = {
    "ping": Ping, "status": Status, "wake": Wake, "submit": Submit, "resubmit": Resubmit, "cancel": Cancel,
    "node_resume": NodeResume, "drift_scan": DriftScan, "checkpoints_prune": CheckpointsPrune,
    "drill": Drill, "drill_status": DrillStatus, "node_triage": NodeTriage,
}
READ_ONLY = frozenset({"ping", "status", "drill_status"})


def parse_request(raw: dict[str, Any]) -> _Request:
    """The request as its op's model; UsageError (one line, exit 2) when it does not fit."""
    op = raw.get("op")
    model = MODELS.get(op) if isinstance(op, str) else None
    if model is None:
        raise UsageError(f"unknown request {op!r}")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:  # the same one line as a bad config key
        raise UsageError(f"{op}: {error_text(exc, model)}") from None
