"""b300ctl against a real b300d: events (filters, --follow), completion, a non-admin
user refused a mutating command by the running daemon, and a checkpoint prune carried
out by the daemon as the user who asked."""

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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from as_user import ctl_as

from b300.checkpoints.layouts import load_layout
from b300.checkpoints.manifest import ensure_manifest
from b300.cli import main as ctl_main
from b300.control.server import call_daemon
from b300.errors import DaemonUnavailableError
from b300.model import RunState
from b300.store import open_store
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
    # b300ctl's own code, in a process of user nobody, from a copy nobody can read.
    return ctl_as(NOBODY_UID, NOBODY_GID, (), "--config", str(cfg), *args)


def test_a_non_admin_is_refused_by_the_running_daemon(shared_daemon: tuple[DaemonHandle, Path],
                                                      tmp_path: Path) -> None:
    handle, cfg = shared_daemon
    spec = write_spec(tmp_path / "job.toml", "ops-ctl", "sleep 300")
    run_id = handle.submit(spec)
    for argv in (["cancel", run_id], ["resubmit", run_id], ["nodes", "resume", "gpu01"]):
        proc = _ctl_as_nobody(cfg, *argv)
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "user nobody may not" in lines[0] and "no admin_group configured" in lines[0]
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
        [sys.executable, "-m", "b300.cli", "--config", str(daemon.config), "events", "--follow", "--json",
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
    proc = subprocess.run([sys.executable, "-m", "b300.cli", "completion", "bash"], capture_output=True,
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


def _checkpointed_run(store_url: str, ckpt: Path, steps: list[int]) -> str:
    """A run (ended) with generic-layout checkpoints a day apart and a month old (outside the
    default hourly and daily rules), each with a manifest and verified, as the daemon's
    checkpoint pass leaves them."""
    now = datetime.now(UTC)
    for i, step in enumerate(steps):
        d = ckpt / f"step_{step}"
        (d / "opt").mkdir(parents=True)
        (d / "model.pt").write_bytes(os.urandom(512))
        (d / "DONE").write_bytes(b"")
        t = (now - timedelta(days=30 - i)).timestamp()
        for f in (d / "model.pt", d / "DONE"):
            os.utime(f, (t, t))
        ensure_manifest(str(d), now)
    spec = (f'name = "pr"\n[job]\ncommand = "true"\nnodes = 1\ngpus_per_node = 0\n'
            f'[checkpoint]\ndir = {json.dumps(str(ckpt))}\nlayout = "generic"\ninterval = "1h"\n')
    with open_store(store_url) as store:
        store.create_run("pr-1", "pr", spec, now)
        store.set_run_state("pr-1", RunState.COMPLETED, now)  # nothing for the tracker to do
        found = load_layout("generic").list_checkpoints(str(ckpt))
        store.checkpoints.record_listing("pr-1", found, now)
        for c in found:
            store.checkpoints.record_verification("pr-1", c.path, True, now)
    return "pr-1"


def test_a_prune_is_carried_out_by_the_daemon_as_the_user(shared_daemon: tuple[DaemonHandle, Path],
                                                          tmp_path: Path) -> None:
    handle, cfg = shared_daemon
    ckpt = tmp_path / "ckpt"
    run_id = _checkpointed_run(handle.database_url, ckpt, [10, 20, 30, 40, 50])
    prune = ["checkpoints", run_id, "--keep-last", "2", "--prune", "--yes"]

    # Not an admin: the daemon refuses, one line, and nothing is deleted.
    proc = _ctl_as_nobody(cfg, *prune)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "user nobody may not checkpoints_prune" in lines[0], proc.stderr
    assert len(list(ckpt.iterdir())) == 5
    refusals = [json.loads(line) for line in handle.log.read_text().splitlines()
                if '"control.refused"' in line]
    assert [(r["op"], r["uid"]) for r in refusals] == [("checkpoints_prune", NOBODY_UID)]

    # The dry run reads locally and changes nothing.
    (report,) = handle.ctl(*prune[:-1])
    assert report["prune"]["dry_run"] is True and len(report["prune"]["deleted"]) == 3
    assert len(list(ckpt.iterdir())) == 5

    # Root: the daemon deletes (rename, then delete), and records it as root.
    (report,) = handle.ctl(*prune)
    assert sorted(Path(p).name for p in report["prune"]["deleted"]) == ["step_10", "step_20", "step_30"]
    assert report["prune"]["dry_run"] is False and report["prune"]["refused"] == ""
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_40", "step_50"]
    assert [c["step"] for c in report["checkpoints"]] == [40, 50]  # the listing is after the prune
    events = handle.ctl("events", "--run", run_id, "--kind", "checkpoint.prune_started",
                        "--kind", "checkpoint.pruned")
    assert [(e["kind"], e["actor"]) for e in events] == [("checkpoint.prune_started", "root"),
                                                         ("checkpoint.pruned", "root")]
    assert sorted(Path(p).name for p in events[-1]["data"]["paths"]) == ["step_10", "step_20", "step_30"]


def _imports_of_status(cfg: Path, env: dict[str, str], *argv: str) -> set[str]:
    code = ("import contextlib, io, json, sys\nfrom b300.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert main({['--config', str(cfg), 'status', *argv]!r}) == 0\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                          env=env)
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_status_from_the_daemon_is_status_from_the_store(daemon: DaemonHandle, tmp_path: Path) -> None:
    """b300ctl status asks the running b300d (and then needs no SQLAlchemy); without a
    daemon it reads the store: the same answer both ways."""
    spec = write_spec(tmp_path / "job.toml", "ops-status", "sleep 300")
    run_id = daemon.submit(spec)
    daemon.wait_run(run_id, {"RUNNING"})
    daemon.ctl("cancel", run_id)
    daemon.wait_run(run_id, {"CANCELLED"})
    asked = {"list": daemon.ctl("status", "--all"), "one": daemon.ctl("status", run_id),
             "text": daemon.ctl_raw("status", run_id).stdout, "list_text": daemon.ctl_raw("status").stdout}
    assert asked["one"]["run"]["state"] == "CANCELLED"
    assert {"sqlalchemy", "sqlmodel"} & _imports_of_status(daemon.config, daemon.env, run_id) == set()
    assert "this host's b300d: active" in asked["list_text"]

    daemon.kill(signal.SIGTERM)
    read = {"list": daemon.ctl("status", "--all"), "one": daemon.ctl("status", run_id),
            "text": daemon.ctl_raw("status", run_id).stdout, "list_text": daemon.ctl_raw("status").stdout}
    assert "sqlalchemy" in _imports_of_status(daemon.config, daemon.env, run_id)
    assert read["list"] == asked["list"] and read["one"] == asked["one"] and read["text"] == asked["text"]
    # The list's last line says what this host's daemon is: active before, not running now.
    assert read["list_text"].splitlines()[:-1] == asked["list_text"].splitlines()[:-1]
    assert "this host's b300d: not running" in read["list_text"].splitlines()[-1]
