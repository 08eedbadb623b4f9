"""The ``[daemon]``, ``[slurm]`` and ``[recovery]`` tables."""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, model_validator

from ...grammar.types import (
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
    #: "observe": track, record, alert and report, and never drain, DOWN, resume, cancel,
    #: signal, resubmit, reserve or delete of its own accord (each such action is logged and
    #: recorded as action.withheld); "act": act as the other sections allow.
    mode: Annotated[str, blank_means("observe"), one_of("observe", "act")] = "observe"
    #: The daemon's own folder: the SQLite database (by default), lock file, control socket,
    #: node-down trigger script.
    state_dir: AbsPath = "/var/lib/b300"
    #: The state store: a sqlite:/// or postgresql:// URL (SQLAlchemy form, e.g.
    #: postgresql+psycopg://b300@db/b300); "" is SQLite in state_dir. Never repeated in an error
    #: message.
    database_url: Annotated[Text, AfterValidator(_database_url)] = ""  # "": SQLite in state_dir
    #: The control socket b300ctl talks to; "" is <state_dir>/b300d.sock.
    socket: Annotated[str, matches(r"/[^\x00\n]{0,100}", "an absolute path of at most 100 characters",
                                   empty=True)] = ""
    #: Where jobs write their output when a spec sets none; shared with the nodes. "" is
    #: <state_dir>/job-logs.
    job_log_dir: AbsPathOrEmpty = ""
    #: The HA lease: two daemons on one PostgreSQL database with the same name form an
    #: active/standby pair.
    lease_name: Annotated[str, matches(GROUP, "a name")] = "default"
    #: A frozen, cut-off or dead active daemon is replaced after this (plus up to 2 s).
    lease_ttl: Annotated[Duration, limited(lambda s: 2 <= s <= 600, "between 2 s and 10 min")] = 15.0
    #: Time between poll cycles (one squeue, one sinfo, one sacct for ended jobs per cycle).
    poll_interval: Annotated[Duration, limited(lambda s: 0.2 <= s <= 3600, "between 0.2 s and 1 h")] = 15.0
    #: An sbatch whose confirmation was lost may still show up in Slurm this long; only then is the
    #: attempt submitted again.
    submit_grace: Duration = 60.0
    #: Longest wait between cycles while slurmctld or the database is down (the wait doubles up to
    #: it).
    max_backoff: Duration = 300.0
    #: The journal's line format: JSON under systemd, readable in a terminal with "auto".
    log_format: Annotated[str, blank_means("auto"), one_of("auto", "json", "console")] = "auto"
    #: Level for b300's own lines and the libraries' (APScheduler, paramiko, SQLAlchemy).
    log_level: Annotated[str, blank_means("info"), one_of("debug", "info", "warning", "error")] = "info"
    #: Members may change things through b300ctl (submit, cancel, resume, prune, drill), besides
    #: root and the daemon's user.
    admin_group: Annotated[str, matches(GROUP, "a group name", empty=True)] = ""
    #: A file holding the PostgreSQL password (read when the store is opened; one trailing
    #: newline stripped), so that the URL carries none and the config can be readable by the
    #: admin group. install.sh makes it root:<admin group> 640.
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
    #: How Slurm is driven: its command-line tools, pyslurm in a worker process, or auto (pyslurm
    #: only when built for the controller's release).
    backend: Annotated[str, blank_means("cli"), one_of("auto", "cli", "pyslurm")] = "cli"
    #: SLURM_CONF for the Slurm tools; "" leaves it to Slurm.
    conf: AbsPathOrEmpty = ""
    #: Folder of sbatch, squeue, ...; "" takes them from PATH.
    bin_dir: AbsPathOrEmpty = ""
    #: Longest a Slurm command may run before the cycle counts it as failed.
    command_timeout: Duration = 30.0
    #: An ended job may lack its sacct record this long (slurmdbd slow or down) before the
    #: controller's view is taken.
    accounting_grace: Duration = 60.0


class RecoveryTable(Table):
    #: false: track only, never drain or resubmit.
    enabled: bool = True
    #: A FAILED job whose peers lost a rank: wait this long for Slurm to name the dead node before
    #: resubmitting.
    settle: Duration = 60.0
    #: Drain a node that failed this many different runs within blackhole_window.
    blackhole_failures: Annotated[int, Field(ge=1, le=1000)] = 3
    #: The window of the black-hole rule.
    blackhole_window: Duration = 86400.0
    #: Arm a permanent strigger on node down that wakes the daemon (allowed to SlurmUser or root
    #: only; else polling alone).
    node_trigger: bool = True
