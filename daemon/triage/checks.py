"""The ``[triage]`` section: which drained nodes are checked on the node, with what, and
what a verdict may do.

::

    [triage]
    enabled = false            # the default: no reservation, no job, no resume, ever
    interval_s = 60            # how often drained nodes are looked at (at most once a cycle)
    partition = "gpu"          # where the triage job runs ("" = the node's first partition)
    user = ""                  # the reservation's Users= (default: the user b300d runs as)
    resume = true              # a pass resumes the node (false: report only)
    lemon_drains = 3           # drained this many times within lemon_window_s: a lemon
    lemon_window_s = 604800    # 7 days
    reboot = false             # true: reboot a node whose checks failed, once, then check it again
    reboot_timeout_s = 1800    # a reboot not done by then: the node failed triage

    [[triage.check]]           # the sequence for every cause, unless a cause has its own
    name = "node-check"
    argv = []                  # [] = the shipped check (b300.triage.node_check)
    args = []                  # arguments of the shipped check, e.g. ["--min-busbw", "300"]
    timeout_s = 600

    [[triage.check]]
    causes = ["straggler"]     # only for stragglers
    name = "nccl"
    argv = ["/opt/nccl-tests/build/all_reduce_perf", "-b", "1G", "-e", "1G"]
    timeout_s = 300

Causes (from the drain reason the daemon wrote): ``attempt`` (a failed attempt),
``liveness`` (node dead), ``drift``, ``straggler``, ``blackhole``, ``drill``, and
``manual`` (``b300ctl nodes triage NODE``). A node drained by a person (a reason not
starting ``b300:``) is triaged only when an operator asks for it.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from ..grammar.types import GROUP, NAME, Table, matches

CAUSES = ("attempt", "liveness", "drift", "straggler", "blackhole", "drill", "manual")
_Word = Annotated[str, Field(min_length=1, max_length=4096)]


class CheckTable(Table):
    """One check: an argv run on the node (no shell), with a timeout."""

    #: The check's name: it names the failed check in the drain reason.
    name: Annotated[str, matches(NAME, "a check name (letters, digits, '.', '_', '-')")]
    #: The program and its arguments ([] = the shipped node check); absolute program path;
    #: {node} in an element is the node's name.
    argv: list[_Word] = Field(default_factory=list, max_length=64)
    #: Arguments of the shipped check (argv = []), e.g. ["--min-busbw", "300"].
    args: list[_Word] = Field(default_factory=list, max_length=64)
    #: Longest the check may run; the job's time limit is the sum of its checks' timeouts.
    timeout_s: float = Field(default=600.0, ge=1.0, le=6 * 3600.0)
    #: Drain causes this check runs for ([] = every cause).
    causes: list[Annotated[str, matches("|".join(CAUSES), "one of " + ", ".join(CAUSES))]] = Field(
        default_factory=list)

    @model_validator(mode="after")
    def _absolute(self) -> CheckTable:
        if self.argv and not self.argv[0].startswith("/"):
            raise ValueError(f"[triage] check {self.name!r}: argv[0] must be an absolute path, "
                             f"got {self.argv[0]!r}")
        return self


def _default_checks() -> list[CheckTable]:
    return [CheckTable(name="node-check")]


class TriageConfig(Table):
    """``[triage]``; nothing is reserved, run or resumed unless ``enabled``."""

    #: false (the default): drained nodes are left as they are, for a person.
    enabled: bool = False
    #: How often drained nodes are looked at (at most once a cycle).
    interval_s: float = Field(default=60.0, ge=1.0, le=3600.0)
    #: Partition of the triage job ("" = the first partition of the node).
    partition: Annotated[str, matches(NAME, "a partition name", empty=True)] = ""
    #: The reservation's Users= (default: the user b300d runs as).
    user: Annotated[str, matches(GROUP, "a user name", empty=True)] = ""
    #: A pass resumes the node (false: the verdict is recorded, the node stays drained).
    resume: bool = True
    #: Drained this many times within lemon_window_s: a lemon, never returned automatically.
    lemon_drains: int = Field(default=3, ge=2, le=1000)
    #: The lemon window in seconds (default 7 days).
    lemon_window_s: float = Field(default=7 * 86400.0, ge=60.0, le=365 * 86400.0)
    #: Reboot a node whose checks failed, once (scontrol reboot; slurm.conf needs a
    #: RebootProgram), then check it again: the second result is the verdict.
    reboot: bool = False
    #: A reboot not done (the node back, DOWN until checked) within this: the node failed.
    reboot_timeout_s: float = Field(default=1800.0, ge=60.0, le=24 * 3600.0)
    #: Triage jobs running at once, cluster-wide.
    max_parallel: int = Field(default=4, ge=1, le=1000)
    #: The checks, in order; each runs for the causes it names (all if none).
    check: list[CheckTable] = Field(default_factory=_default_checks, min_length=1, max_length=64)

    def checks_for(self, cause: str) -> tuple[CheckTable, ...]:
        return tuple(c for c in self.check if not c.causes or cause in c.causes)
