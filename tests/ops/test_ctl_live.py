"""b300ctl against a real b300d: events (filters, --follow), completion, and a non-admin
user refused a mutating command by the running daemon."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pytest

from b300.control import call_daemon
from b300.ctl import main as ctl_main
from b300.errors import DaemonUnavailableError
from helpers import DaemonHandle, make_daemon, wait_for, write_spec

pytestmark = pytest.mark.slurm
NOBODY_UID = 65534
NOBODY_GID = 65534


@dataclass
class _SharedHandle(DaemonHandle):
    """A daemon handle whose socket is outside the state dir."""

    sock: str = ""

    def ping(self) -> bool:
        try:
            return bool(call_daemon(self.sock, {"op": "ping"}, timeout=5).get("ok"))
        except DaemonUnavailableError:
            return False


@pytest.fixture
def shared_daemon(tmp_path: Path, slurm_conf: str) -> Iterator[tuple[DaemonHandle, Path]]:
    """A b300d whose socket and config other users can reach (pytest's tmp dirs are 0700)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as user nobody")
    shared = Path(tempfile.mkdtemp(prefix="b300-ctl-"))
    shared.chmod(0o755)
    base = make_daemon(tmp_path, slurm_conf, socket=str(shared / "b300d.sock"))
    handle = _SharedHandle(**{f.name: getattr(base, f.name) for f in fields(base)},
                           sock=str(shared / "b300d.sock"))
    cfg = shared / "b300.toml"
    shutil.copy(handle.config, cfg)
    cfg.chmod(0o644)
    try:
        handle.start()
    except BaseException:
        handle.cleanup()
        raise
    (shared / "b300d.sock").chmod(0o666)  # reachable by anyone: the daemon itself must refuse
    try:
        yield handle, cfg
    finally:
        handle.cleanup()
        shutil.rmtree(shared, ignore_errors=True)


def _ctl_as_nobody(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # b300ctl's own code, in a process of user nobody. The interpreter lives under /root
    # (mode 0700 here), which nobody cannot exec, so the process starts as root, imports
    # b300.ctl, drops to nobody for good (groups, gid, uid), then runs main().
    code = ("import os, sys\nimport b300.ctl\n"
            f"os.setgroups([]); os.setgid({NOBODY_GID}); os.setuid({NOBODY_UID})\n"
            "assert os.getuid() == os.geteuid() == %d\n" % NOBODY_UID
            + "sys.exit(b300.ctl.main(sys.argv[1:]))\n")
    return subprocess.run([sys.executable, "-c", code, "--config", str(cfg), *args], capture_output=True,
                          text=True, timeout=60, check=False, env={**os.environ, "HOME": "/"})


def test_a_non_admin_is_refused_by_the_running_daemon(shared_daemon: tuple[DaemonHandle, Path],
                                                      tmp_path: Path) -> None:
    handle, cfg = shared_daemon
    spec = write_spec(tmp_path / "job.toml", "ops-ctl", "sleep 300")
    run_id = handle.submit(spec)
    for argv in (["cancel", run_id], ["resubmit", run_id], ["nodes", "resume", "gpu01"]):
        proc = _ctl_as_nobody(cfg, *argv)
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "user nobody may not" in lines[0] and "not in admin group" in lines[0]
    # The refusal is the daemon's: it logged it with the peer's uid from SO_PEERCRED.
    refusals = [json.loads(line) for line in handle.log.read_text().splitlines()
                if '"control.refused"' in line]
    assert {r["op"] for r in refusals} == {"cancel", "resubmit", "node_resume"}
    assert all(r["uid"] == NOBODY_UID for r in refusals)

    # Root (an admin) is allowed; each change is an event with the actor's user name.
    handle.ctl("cancel", run_id)
    events = handle.ctl("events", "--run", run_id)
    actors = {e["kind"]: e["actor"] for e in events}
    assert actors["run.created"] == "root" and actors["run.cancel"] == "root"
    assert all(e["actor"] != "nobody" for e in events)


def test_events_filters_and_follow(daemon: DaemonHandle, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(tmp_path / "job.toml", "ops-events", "sleep 300")
    run_id = daemon.submit(spec)

    def events(*args: str) -> Any:  # queries read the store: b300ctl's main() in-process is enough
        capsys.readouterr()
        assert ctl_main(["--config", str(daemon.config), "--json", "events", *args]) == 0
        return json.loads(capsys.readouterr().out)

    everything = events()
    assert any(e["kind"] == "run.created" and e["run_id"] == run_id for e in everything)
    only = events("--run", run_id, "--kind", "run.created")
    assert [e["kind"] for e in only] == ["run.created"]
    prefixed = events("--kind", "attempt.", "--since", "1h")
    assert prefixed and all(e["kind"].startswith("attempt.") for e in prefixed)
    assert events("--since", "2999-01-01") == []
    assert ctl_main(["--config", str(daemon.config), "events", "--since", "yesterday-ish"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1

    follow = subprocess.Popen(
        [sys.executable, "-m", "b300.ctl", "--config", str(daemon.config), "events", "--follow", "--json",
         "--kind", "run.cancel"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=daemon.env)
    try:
        wait_for(lambda: follow.poll() is None, 5, "events --follow to start")
        daemon.ctl("cancel", run_id)
        assert follow.stdout is not None
        line = follow.stdout.readline()  # blocks until the follower prints the new event
        assert json.loads(line)["kind"] == "run.cancel"
    finally:
        follow.send_signal(signal.SIGTERM)
        follow.communicate(timeout=10)  # also closes the pipes
    assert follow.returncode == 0


def test_completion_script_is_generated_from_the_parser(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "b300.ctl", "completion", "bash"], capture_output=True,
                          text=True, timeout=30, check=True)
    script = tmp_path / "b300ctl.bash"
    script.write_text(proc.stdout)

    def complete(*words: str) -> list[str]:
        probe = (f"source {script}; COMP_WORDS=({' '.join(repr(w) for w in ('b300ctl', *words))}); "
                 f"COMP_CWORD={len(words)}; _b300ctl; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
        return subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30,
                              check=True).stdout.split()

    assert {"events", "report", "status", "submit", "drift", "completion"} <= set(complete(""))
    assert complete("ev") == ["events"]
    assert complete("drift", "") == ["scan"]
    assert "--follow" in complete("events", "--f")
    assert complete("report", "--format", "") == ["html", "json", "text"]
