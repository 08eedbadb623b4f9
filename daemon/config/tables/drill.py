"""The ``[drill]`` table (record: :class:`b300.drill.crash_config.DrillConfig`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from ...drill.crash_config import DrillConfig, command_problem
from ...grammar.types import Duration, Table, limited, problem

_Word = Annotated[str, Field(min_length=1, max_length=4096)]


def _command(value: list[str]) -> list[str]:
    if (why := command_problem(value)) is not None:
        raise problem(why)
    return value


Command = Annotated[list[_Word], Field(max_length=64), AfterValidator(_command)]


class DrillTable(Table):
    #: b300ctl drill --method crash runs this argv (absolute program path, {node} as an element of
    #: its own; never a shell).
    crash_command: Command = Field(default_factory=list)
    #: Run after a crash drill to bring the node back (same rules); optional.
    restore_command: Command = Field(default_factory=list)
    #: Longest the crash or restore command may run.
    command_timeout: Annotated[Duration, limited(lambda s: 1 <= s <= 3600, "between 1 s and 1 h")] = 60.0


def drill_config(t: DrillTable) -> DrillConfig:
    return DrillConfig(crash_command=tuple(t.crash_command), restore_command=tuple(t.restore_command),
                       command_timeout_s=t.command_timeout)
