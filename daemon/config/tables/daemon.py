"""The ``[daemon]``, ``[slurm]`` and ``[recovery]`` tables."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

from ..types import (
    GROUP,
    AbsPath,
    AbsPathOrEmpty,
    Duration,
    Table,
    Text,
    blank_means,
    limited,
    matches,
    one_of,
    problem,
)

_DATABASE_URL = re.compile(r"(sqlite|postgresql)(\+\w+)?://")


def _database_url(value: str) -> str:
    # The value is not repeated: a URL may carry a password.
    if value and not _DATABASE_URL.match(value):
        raise problem("must be a sqlite:/// or postgresql:// URL")
    return value


class DaemonTable(Table):
    #: "observe": track, record, alert and report, never act of its own accord; "act": drain,
    #: resubmit, signal, prune as the other sections allow. Changing it needs a restart.
    mode: Annotated[str, blank_means("observe"), one_of("observe", "act")] | None = None
    state_dir: AbsPath = "/var/lib/b300"
    database_url: Annotated[Text, AfterValidator(_database_url)] = ""  # "": SQLite in state_dir
    socket: Annotated[str, matches(r"/[^\x00\n]{0,100}", "an absolute path of at most 100 characters",
                                   empty=True)] = ""
    job_log_dir: AbsPathOrEmpty = ""
    lease_name: Annotated[str, matches(GROUP, "a name")] = "default"
    lease_ttl: Annotated[Duration, limited(lambda s: 2 <= s <= 600, "between 2 s and 10 min")] = 15.0
    poll_interval: Annotated[Duration, limited(lambda s: 0.2 <= s <= 3600, "between 0.2 s and 1 h")] = 15.0
    submit_grace: Duration = 60.0
    max_backoff: Duration = 300.0
    log_format: Annotated[str, blank_means("auto"), one_of("auto", "json", "console")] = "auto"
    log_level: Annotated[str, blank_means("info"), one_of("debug", "info", "warning", "error")] = "info"
    admin_group: Annotated[str, matches(GROUP, "a group name", empty=True)] = ""


class SlurmTable(Table):
    backend: Annotated[str, blank_means("cli"), one_of("auto", "cli", "pyslurm")] = "cli"
    conf: AbsPathOrEmpty = ""
    bin_dir: AbsPathOrEmpty = ""
    command_timeout: Duration = 30.0
    accounting_grace: Duration = 60.0


class RecoveryTable(Table):
    enabled: bool = True
    settle: Duration = 60.0
    blackhole_failures: Annotated[int, Field(ge=1, le=1000)] = 3
    blackhole_window: Duration = 86400.0
    node_trigger: bool = True
