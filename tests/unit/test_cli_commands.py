"""The b300ctl package's shape: commands registered one way, imports only what a command
runs, changes only through the daemon, and the old module name still works.

These run b300ctl as real processes on a real SQLite store; none needs Slurm or a daemon.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from b300.cli import COMMANDS, build_parser
from b300.cli.command import walk
from b300.store import open_store

# What a query must never pull in: the daemon and its scheduler, SSH, migrations.
_DAEMON_ONLY = ("apscheduler", "paramiko", "alembic", "b300.service", "b300.ha.lease", "b300.tracker",
                "b300.recovery.service", "b300.checkpoints.upkeep")


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    with open_store(f"sqlite:///{state / 'state.db'}") as store:
        spec = 'name = "q"\n[job]\ncommand = "true"\nnodes = 1\ngpus_per_node = 0\n'
        store.create_run("q-1", "q", spec, datetime.now(UTC))
        attempt = store.begin_attempt("q-1", datetime.now(UTC), excluded_nodes=["gpu03"])
        store.confirm_attempt(attempt.id, 4242, datetime.now(UTC))
    p = tmp_path / "b300.toml"
    p.write_text(f"[daemon]\nstate_dir = {json.dumps(str(state))}\n")
    return p


def _modules_after(cfg: Path, *argv: str) -> tuple[int, set[str]]:
    """Run b300ctl in a fresh interpreter; its exit code and every module it imported."""
    code = ("import contextlib, io, json, sys\nfrom b300.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    rc = main({['--config', str(cfg), *argv]!r})\n"
            "print(json.dumps([rc, sorted(sys.modules)]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    rc, modules = json.loads(proc.stdout.strip().splitlines()[-1])
    return rc, set(modules)


def _pulled(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


def test_importing_the_cli_imports_no_dependency() -> None:
    code = "import sys, json\nimport b300.cli\nprint(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    modules = set(json.loads(proc.stdout))
    assert _pulled(modules, ("sqlalchemy", "sqlmodel", "pydantic", "structlog", "ClusterShell",
                             *_DAEMON_ONLY)) == []


@pytest.mark.parametrize("argv", [["status"], ["status", "q-1"], ["--json", "status", "q-1"], ["nodes"],
                                  ["events"], ["checkpoints"], ["report", "--since", "7d"]])
def test_a_query_imports_no_part_of_the_daemon(cfg: Path, argv: list[str]) -> None:
    rc, modules = _modules_after(cfg, *argv)
    assert rc == 0
    assert _pulled(modules, _DAEMON_ONLY) == []


def test_status_does_not_pay_for_logging(cfg: Path) -> None:
    """structlog imports rich's pretty-printer when it is installed; `status` (the list) needs neither."""
    rc, modules = _modules_after(cfg, "status")
    assert rc == 0 and _pulled(modules, ("structlog", "rich")) == []


@pytest.mark.parametrize("argv", [["submit", "SPEC"], ["resubmit", "q-1"], ["cancel", "q-1"],
                                  ["nodes", "resume", "gpu01"], ["notify", "node-down", "gpu01"],
                                  ["drift", "scan"], ["checkpoints", "q-1", "--prune", "--yes"],
                                  ["drill", "q-1"]])
def test_every_change_is_a_request_to_the_daemon(tmp_path: Path, argv: list[str]) -> None:
    """No daemon and no store at all: each change fails on the socket (5), not the store (4)."""
    spec = tmp_path / "s.toml"
    spec.write_text('name = "x"\n[job]\ncommand = "true"\nnodes = 1\n')
    cfg = tmp_path / "b300.toml"
    cfg.write_text(f"[daemon]\nstate_dir = {json.dumps(str(tmp_path / 'none'))}\n")
    argv = [str(spec) if a == "SPEC" else a for a in argv]
    proc = subprocess.run([sys.executable, "-m", "b300.cli", "--config", str(cfg), *argv],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 5, (argv, proc.stderr)
    assert proc.stderr.count("\n") == 1 and "b300d is not running" in proc.stderr
    assert not (tmp_path / "none" / "state.db").exists()


def test_the_mutating_flag_names_exactly_the_requests() -> None:
    assert {p for p, c in walk(COMMANDS) if c.mutating} == {"submit", "resubmit", "cancel", "notify",
                                                              "drift scan", "drill"}


def test_every_command_is_parsed_into_its_record() -> None:
    parser = build_parser()
    for path, command in walk(COMMANDS):
        needed = [a for a in command.arguments if not a.is_option and a.options.get("nargs") not in ("?", "*")]
        values = [a.choices[0] if a.choices else "x" for a in needed]
        required = [a for a in command.arguments if a.is_option and a.options.get("required")]
        values += [w for a in required for w in (a.flags[0], "x")]
        extra = ["--since", "7d"] if path == "report" else []
        args = parser.parse_args([*path.split(), *values, *extra])
        assert args.command_record is command, path


def test_the_old_module_name_is_the_same_program(cfg: Path) -> None:
    new = subprocess.run([sys.executable, "-m", "b300.cli", "--config", str(cfg), "--json", "status", "q-1"],
                         capture_output=True, text=True, timeout=60, check=True)
    old = subprocess.run([sys.executable, "-m", "b300.ctl", "--config", str(cfg), "--json", "status", "q-1"],
                         capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(new.stdout)["run"]["id"] == "q-1"
    assert json.loads(old.stdout) == json.loads(new.stdout)


def test_status_shows_each_in_allocation_relaunch_and_its_step(tmp_path: Path) -> None:
    """`b300ctl status RUN` of a spare_nodes run: one row per relaunch in the same job
    (generation, exclusions, checkpoint, spares left) with the step Slurm started for it."""
    from b300.events import Kind
    from b300.interfaces import NewEvent

    state = tmp_path / "state"
    state.mkdir()
    now = datetime.now(UTC)
    with open_store(f"sqlite:///{state / 'state.db'}") as store:
        spec = 'name = "s"\n[job]\ncommand = "python train.py"\nnodes = 2\nspare_nodes = 2\n'
        store.create_run("s-1", "s", spec, now)
        a = store.begin_attempt("s-1", now)
        store.confirm_attempt(a.id, 777, now)
        for gen, node, step in ((1, "gpu02", 1), (2, "gpu04", None)):
            store.append_events([NewEvent(Kind.ATTEMPT_STEP_RELAUNCH, run_id="s-1", attempt_id=a.id,
                                          actor="recovery", data={
                                              "job_id": 777, "generation": gen, "exclude": [node],
                                              "resume_from": f"/ckpt/step_{gen * 10}",
                                              "spares_left": 2 - gen, "cause": "node lost"})], now)
            if step is not None:
                store.append_events([NewEvent(Kind.ATTEMPT_STEP_STARTED, run_id="s-1", attempt_id=a.id,
                                              data={"job_id": 777, "generation": gen, "step_id": step,
                                                    "nodes": ["gpu01", "gpu03"], "exclude": [node]})], now)
    cfg = tmp_path / "b300.toml"
    cfg.write_text(f"[daemon]\nstate_dir = {json.dumps(str(state))}\n")
    out = subprocess.run([sys.executable, "-m", "b300.cli", "--config", str(cfg), "status", "s-1"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    section = out.split("step relaunches in the same job (spare_nodes):", 1)[1].split("events:", 1)[0]
    rows = [line.split() for line in section.strip().splitlines()]
    assert rows[0][:4] == ["AT", "ATTEMPT", "JOB", "GEN"]
    assert [r[2:5] for r in rows[1:]] == [["1", "777", "1"], ["1", "777", "2"]]   # AT is 2 words
    assert "gpu02" in rows[1] and "/ckpt/step_10" in rows[1] and rows[1][-2:] == ["step", "1"]
    assert "gpu04" in rows[2] and rows[2][-2:] == ["not", "yet"]
