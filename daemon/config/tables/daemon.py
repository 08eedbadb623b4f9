"""The ``[daemon]``, ``[slurm]`` and ``[recovery]`` tables."""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, model_validator

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
    # A file holding the PostgreSQL password (read at start), so that the URL here
    # carries none and the config can be readable by the admin group.
    database_password_file: AbsPathOrEmpty = ""

    @model_validator(mode="after")
    def _one_place_for_the_password(self) -> DaemonTable:
        if not self.database_password_file:
            return self
        if not self.database_url.startswith("postgresql"):
            raise problem("database_password_file needs a postgresql:// database_url")
        try:
            has_password = urlsplit(self.database_url).password is not None
        except ValueError:
            has_password = False  # a URL urllib cannot split is refused when it is opened
        if has_password:
            raise problem("database_url carries a password and database_password_file is set: "
                          "remove the password from the URL")
        return self


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
