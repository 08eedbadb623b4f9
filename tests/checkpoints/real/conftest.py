"""Checkpoints written by the real libraries, once per session, and their own loaders as the oracle.

``libs.py`` runs in its own processes (two ranks on a gloo group for the
distributed kinds), so each library initialises exactly as in a training job.
Every process is bounded in time; a library that fails fails the test with its
output.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

LIBS = Path(__file__).with_name("libs.py")
TWO_RANKS = {"dcp", "dcp-async", "dcp-nocoll", "mcore", "mcore-async", "deepspeed"}
TIMEOUT_S = int(os.environ.get("B300_LIB_TIMEOUT_S", "240"))


def _free_port() -> int:
    base = int(os.environ.get("B300_PORT_BASE", "17800")) + 40
    for port in range(base, base + 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    pytest.fail("no free port for the gloo rendezvous")


def run_lib(action: str, kind: str, root: Path, paths: list[Path] | None = None) -> dict[str, str]:
    """Run ``libs.py`` (both ranks where distributed); the loader's verdict per path ('' = loaded)."""
    ranks = 2 if kind in TWO_RANKS else 1
    port = _free_port()
    argv = [sys.executable, str(LIBS), action, kind, str(root), *[str(p) for p in paths or []]]
    procs = []
    logs = []
    # Output goes to files, not pipes: megatron-core's async writer forks helpers that keep a
    # pipe open after the rank itself has exited.
    for rank in range(ranks):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(ranks),
               "RANK": str(rank), "LOCAL_RANK": str(rank), "DS_ACCELERATOR": "cpu", "PYTHONWARNINGS": "ignore",
               "OMP_NUM_THREADS": "1"}
        log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below
        logs.append(log)
        procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
    outputs = []
    try:
        for proc, log in zip(procs, logs, strict=True):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=TIMEOUT_S)
            log.seek(0)
            outputs.append(log.read().decode("utf-8", "replace"))
    finally:
        for proc, log in zip(procs, logs, strict=True):
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            log.close()
    for proc, out in zip(procs, outputs, strict=True):
        if proc.returncode != 0:  # killed after TIMEOUT_S too
            pytest.fail(f"libs.py {action} {kind} exited {proc.returncode}:\n{out[-3000:]}")
    if action == "save":
        return {}
    verdicts: dict[str, str] = {}
    for out in outputs:  # every rank must load: a path fails if any rank's load failed
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        assert lines, f"libs.py load {kind} printed no result:\n{out[-3000:]}"
        for path, why in json.loads(lines[-1][len("RESULT "):]).items():
            verdicts[path] = verdicts.get(path) or why
    return verdicts


class Written:
    """Pristine checkpoints of each kind, written once per session (``root(kind)``)."""

    def __init__(self, base: Path) -> None:
        self._base = base
        self._done: dict[str, Path] = {}

    def root(self, kind: str) -> Path:
        if kind not in self._done:
            root = self._base / kind
            run_lib("save", kind, root)
            self._done[kind] = root
        return self._done[kind]

    def copy(self, kind: str, name: str, dest: Path) -> Path:
        """A byte-for-byte copy (times kept) of one pristine checkpoint ``name`` under ``dest``."""
        src = self.root(kind) / name
        dest.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dest / name)
        else:
            shutil.copy2(src, dest / name)
        return dest / name


@pytest.fixture(scope="session")
def written(tmp_path_factory: pytest.TempPathFactory) -> Written:
    return Written(tmp_path_factory.mktemp("written"))
