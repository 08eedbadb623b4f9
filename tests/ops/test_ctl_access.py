"""b300ctl's read commands as a user who may not read what they need: one line, exit 2.

User ``nobody`` (no groups) runs every read command against a config, state
folder, database file, PostgreSQL password file and control socket it may not
use; each answer is one line on stderr naming the path and the access that is
missing, exit code 2 (README "CLI": wrong input, a refusal), never a traceback.
The process runs b300ctl's own code from a copy nobody can read (tests/as_user.py),
so this works from a clone under /root too.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from as_user import ctl_as

from b300.store import open_store

NOBODY = 65534
RUN = "r-access"
READS: tuple[tuple[str, ...], ...] = (
    ("status",), ("status", RUN), ("events",), ("events", "--run", RUN), ("nodes",),
    ("checkpoints",), ("checkpoints", RUN), ("drift",), ("report", "--since", "7d", "--format", "text"),
)


@pytest.fixture
def site() -> Iterator[Path]:
    """A readable folder with a config, a SQLite store holding one run, and a socket folder."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as user nobody")
    top = Path(tempfile.mkdtemp(prefix="b300-access-", dir="/var/tmp"))
    top.chmod(0o755)
    state = top / "state"
    store = open_store(f"sqlite:///{state}/state.db")
    store.create_run(RUN, "access", '[job]\ncommand = "true"\n', datetime.now(UTC))
    store.close()
    (top / "run").mkdir()
    _config(top, f"sqlite:///{state}/state.db")
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _config(top: Path, url: str, extra: str = "") -> Path:
    cfg = top / "b300.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{top / "state"}"\ndatabase_url = "{url}"\n'
                   f'socket = "{top / "sock" / "b300d.sock"}"\nadmin_group = "b300-nogroup"\n{extra}'
                   f'[checkpoints]\nroots = ["{top / "run"}"]\n')
    cfg.chmod(0o644)
    return cfg


def _one_line_refusal(args: tuple[str, ...], cfg: Path, *needles: str) -> None:
    proc = ctl_as(NOBODY, NOBODY, (), "--config", str(cfg), *args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (args, proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and len(lines) == 1, (args, proc.stderr[-2000:])
    for needle in needles:
        assert needle in lines[0], (args, lines[0])


def test_an_unreadable_config_is_one_line(site: Path) -> None:
    cfg = site / "b300.toml"
    cfg.chmod(0o600)
    for args in (*READS, ("cancel", RUN)):
        _one_line_refusal(args, cfg, f"config file {cfg} is not readable by user nobody",
                          "no read (r) permission", "mode 0600, root:root")


def test_an_unreadable_state_folder_is_one_line(site: Path) -> None:
    state = site / "state"
    state.chmod(0o700)
    for args in READS:
        _one_line_refusal(args, site / "b300.toml", f"the state store {state}/state.db is not readable "
                          "by user nobody", f"no search (x) permission on {state} (mode 0700")


def test_an_unreadable_database_file_is_one_line(site: Path) -> None:
    db = site / "state" / "state.db"
    db.chmod(0o600)
    for args in READS:
        _one_line_refusal(args, site / "b300.toml", f"the state store {db} is not readable by user "
                          "nobody", f"no read (r) permission on {db}")


def test_a_readable_store_answers_nobody(site: Path) -> None:
    # The control: the same commands work once the paths are readable (the daemon is
    # stopped: no WAL index, and nobody may not write the folder to make one).
    for args in (("status", RUN), ("events",), ("nodes",)):
        proc = ctl_as(NOBODY, NOBODY, (), "--config", str(site / "b300.toml"), *args)
        assert proc.returncode == 0, (args, proc.stderr[-2000:])
    assert RUN in ctl_as(NOBODY, NOBODY, (), "--config", str(site / "b300.toml"), "status").stdout


def test_an_unreadable_password_file_is_one_line(site: Path) -> None:
    secret = site / "db.pass"
    secret.write_text("s3cret\n")
    secret.chmod(0o640)  # root:root: only the group root may read it
    cfg = _config(site, "postgresql+psycopg://b300@127.0.0.1:5432/test",
                  f'database_password_file = "{secret}"\n')
    for args in READS:  # no daemon answers: status reads the store too
        _one_line_refusal(args, cfg, f"the state store's password file {secret} is not readable by "
                          "user nobody", "admin group", "b300ctl status")


def test_a_socket_the_user_may_not_use_is_a_refusal(site: Path) -> None:
    folder = site / "sock"
    folder.mkdir()
    folder.chmod(0o755)
    path = folder / "b300d.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listening:
        listening.bind(str(path))
        listening.listen(1)
        path.chmod(0o660)  # as b300d leaves it; root:root here, so the kernel refuses nobody
        for args, op in ((("cancel", RUN), "cancel"), (("resubmit", RUN), "resubmit"),
                         (("nodes", "resume", "gpu01"), "node_resume")):
            _one_line_refusal(args, site / "b300.toml",
                              f"user nobody may not {op}: not in group b300-nogroup",
                              f"no write (w) permission on {path} (mode 0660, root:root)")
        # status falls back to the store when the socket refuses it.
        proc = ctl_as(NOBODY, NOBODY, (), "--config", str(site / "b300.toml"), "status", RUN)
        assert proc.returncode == 0, proc.stderr
