"""Helpers for the live tests: drive a real b300d and real Slurm tools.

Nothing of the project's own code is faked here: the daemon runs as its own
process (``python -m b300.app.main``), b300ctl as another, and both talk
to the Slurm cluster that ``deploy/localcluster.sh`` brings up on this machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
CLUSTER = REPO / "deploy" / "localcluster.sh"



class SideCluster:
    """A namespace-mode local cluster of one test module's own (its own dir, name, ports and
    network), so the module can power nodes off without touching the main test cluster.

    ``B300_<KEY>_TEST_DIR``, ``_NAME``, ``_PORT_BASE`` and ``_NET`` override the defaults
    (helper runs and CI runs on one machine keep out of each other's way)."""

    def __init__(self, key: str, name: str, port_base: int, directory: str) -> None:
        def knob(what: str, default: str) -> str:
            return os.environ.get(f"B300_{key}_TEST_{what}", default)

        self.env = {
            "B300_CLUSTER_DIR": knob("DIR", directory),
            "B300_CLUSTER_NAME": knob("NAME", name),
            "B300_PORT_BASE": knob("PORT_BASE", str(port_base)),
            "B300_NETNS": "1", "B300_NODES": "4", "B300_SLURMD_TIMEOUT": "300",
        }
        if os.environ.get(f"B300_{key}_TEST_NET"):
            self.env["B300_NETNS_NET"] = os.environ[f"B300_{key}_TEST_NET"]

    def lc(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``localcluster.sh ARGS`` for this cluster (not the main one's SLURM_CONF)."""
        env = {**os.environ, **self.env}
        env.pop("SLURM_CONF", None)
        return subprocess.run(["bash", str(CLUSTER), *args], env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def must(self, *args: str, timeout: float = 300) -> str:
        proc = self.lc(*args, timeout=timeout)
        assert proc.returncode == 0, f"localcluster.sh {args}: {proc.stdout}\n{proc.stderr}"
        return proc.stdout + proc.stderr

    @contextlib.contextmanager
    def running(self) -> Iterator[str]:
        """Bring the cluster up, yield its SLURM_CONF, take it down afterwards."""
        out = self.must("up")
        found = re.search(r"export SLURM_CONF=(\S+)", out)
        assert found, out
        try:
            yield found.group(1)
        finally:
            self.lc("down")

def wait_for(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.25,
             *, ignoring: tuple[type[BaseException], ...] = ()) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` s.

    An exception of a type in ``ignoring`` counts as "not yet" (e.g. ConnectionError
    while a server starts listening); any other exception fails the test at once.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except ignoring as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(every)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def gated_command(gate: Path) -> str:
    """A job command that runs until the test creates ``gate``, then exits 0.

    For a job that must still run at some later point of a test: a timed one
    (``sleep 20``) can end before that point on a loaded machine. Bounded: after
    10 minutes without the gate it exits 1.
    """
    return f"for i in $(seq 1200); do [ -e {gate} ] && exit 0; sleep 0.5; done; exit 1"


def cluster_up() -> None:
    """``localcluster.sh up`` (idempotent: restarts what was stopped); on failure the
    test fails with the script's own account of why."""
    proc = subprocess.run(["bash", str(CLUSTER), "up"], capture_output=True, text=True,
                          timeout=300, check=False)
    if proc.returncode != 0:
        pytest.fail(f"localcluster.sh up failed ({proc.returncode}):\n{proc.stderr[-4000:]}")


def slurm_cmd(conf: str, *argv: str) -> str:
    env = {**os.environ, "SLURM_CONF": conf, "SLURM_TIME_FORMAT": "standard"}
    return subprocess.run(
        list(argv), capture_output=True, text=True, env=env, timeout=60, check=True
    ).stdout


@dataclass
class DaemonHandle:
    """A running b300d plus helpers to drive it the way an operator would."""

    config: Path
    state_dir: Path
    slurm_conf: str
    database_url: str
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(default_factory=Path)

    def start(self, extra_env: dict[str, str] | None = None, *, wait: bool = True) -> None:
        assert self.proc is None or self.proc.poll() is not None
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "b300.app.main", "--config", str(self.config)],
                env={**self.env, **(extra_env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        if not wait:
            return
        wait_for(lambda: self.ping() or self.proc.poll() is not None, 60, "b300d to answer")
        if self.proc.poll() is not None:
            pytest.fail(f"b300d exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")

    def ping(self) -> bool:
        from b300.control.server import call_daemon
        from b300.errors import DaemonUnavailableError

        try:
            return bool(
                call_daemon(str(self.state_dir / "b300d.sock"), {"op": "ping"}, timeout=5).get("ok")
            )
        except DaemonUnavailableError:
            return False

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)

    def cleanup(self) -> None:
        """Stop the daemon, cancel the jobs of its runs, clear its Slurm triggers."""
        self.kill(signal.SIGTERM)
        cancel_test_jobs(self.slurm_conf, self)

    def ctl_raw(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "b300.ctl", "--config", str(self.config), *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            check=False,
        )

    def ctl(self, *args: str) -> Any:
        """Run b300ctl with --json, insist on success, return the parsed output."""
        proc = self.ctl_raw("--json", *args)
        assert proc.returncode == 0, f"b300ctl {args} -> {proc.returncode}: {proc.stderr}"
        return json.loads(proc.stdout)

    def submit(self, spec_path: Path) -> str:
        return str(self.ctl("submit", str(spec_path))["run"]["id"])

    def run(self, run_id: str) -> dict[str, Any]:
        return dict(self.ctl("status", run_id))

    def wait_run(self, run_id: str, states: set[str], timeout: float = 120) -> dict[str, Any]:
        return dict(
            wait_for(
                lambda: (r := self.run(run_id))["run"]["state"] in states and r,
                timeout,
                f"run {run_id} to reach {states}",
            )
        )


def write_spec(path: Path, name: str, command: str, nodes: int = 1, **job: Any) -> Path:
    lines = [
        f"name = {json.dumps(name)}",
        "[job]",
        f"command = {json.dumps(command)}",
        f"nodes = {nodes}",
        "gpus_per_node = 0",
    ]
    lines += [f"{k} = {json.dumps(v)}" for k, v in job.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def make_daemon(
    tmp_path: Path, slurm_conf: str, database_url: str | None = None, **daemon_opts: Any
) -> DaemonHandle:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    url = database_url or f"sqlite:///{state}/state.db"
    opts = {
        "mode": "act",  # the tests drive a daemon that acts (the default, "observe", never does)
        "poll_interval": "0.5s",
        "submit_grace": "3s",
        "log_format": "json",
        "log_level": "debug",
        **daemon_opts,
    }
    cfg = tmp_path / "b300.toml"
    cfg.write_text(
        "[daemon]\n"
        + f"state_dir = {json.dumps(str(state))}\n"
        + f"database_url = {json.dumps(url)}\n"
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in opts.items())
        + '[slurm]\nbackend = "cli"\n'
        + f"conf = {json.dumps(slurm_conf)}\n"
    )
    env = {**os.environ, "SLURM_CONF": slurm_conf}
    env.pop("B300_CRASH_AT", None)
    return DaemonHandle(
        config=cfg,
        state_dir=state,
        slurm_conf=slurm_conf,
        database_url=url,
        env=env,
        log=tmp_path / "b300d.log",
    )


def cancel_test_jobs(slurm_conf: str, handle: DaemonHandle) -> None:
    """Cancel whatever the test left in the queue under the daemon's run ids."""
    out = slurm_cmd(slurm_conf, "squeue", "--noheader", "--format=%i|%j")
    from b300.store import open_store

    store = open_store(handle.database_url)
    try:
        tags = {a.tag for r in store.list_runs() for a in store.attempts(r.id)}
    finally:
        store.close()
    ids = [line.split("|")[0] for line in out.splitlines() if line.split("|")[-1] in tags]
    if ids:
        slurm_cmd(slurm_conf, "scancel", *ids)
    clear_triggers(slurm_conf, str(handle.state_dir))


def clear_triggers(slurm_conf: str, under: str) -> None:
    """Remove the node-down triggers a test daemon armed (their program is in its temp dir)."""
    env = {**os.environ, "SLURM_CONF": slurm_conf}
    out = subprocess.run(["strigger", "--get"], capture_output=True, text=True, env=env,
                         timeout=30, check=False).stdout
    for line in out.splitlines()[1:]:
        fields = line.split()
        if fields and fields[0].isdigit() and under in line:
            subprocess.run(["strigger", "--clear", f"--id={fields[0]}"], capture_output=True,
                           env=env, timeout=30, check=False)


class CuttableProxy:
    """A TCP proxy to PostgreSQL that can stop forwarding while keeping every socket open.

    That is what a partition behind a middlebox looks like to both ends: the
    kernel still accepts and acknowledges, nothing arrives. Bounded: it stops
    with the test (``close``).
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self._cut.set()

    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._socks.append(client)
            if self._cut.is_set():
                continue  # accepted, never forwarded
            try:
                server = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks.append(server)
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        while not self._closed.is_set():
            if self._cut.is_set():
                self._closed.wait(0.2)  # hold both sockets open, read nothing
                continue
            try:
                ready, _, _ = select.select([a, b], [], [], 0.2)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        peers[s].close()
                        s.close()
                        return
                    peers[s].sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            for s in self._socks:
                s.close()
