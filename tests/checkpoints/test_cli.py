"""``b300ctl checkpoints`` as a real process on a real store and real checkpoint directories."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from ckpt_fixtures import generic

from b300.checkpoints.layouts import load_layout
from b300.checkpoints.manifest import ensure_manifest
from b300.cli import main
from b300.store import open_store

NOW = datetime.now(UTC)


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    ckpt = tmp_path / "ckpt dir"
    for i, step in enumerate((10, 20, 30, 40, 50)):
        d = generic(ckpt, step, t=(NOW - timedelta(days=30 - i)).timestamp())
        ensure_manifest(str(d), NOW)
    generic(ckpt, 60, done=False)
    db = tmp_path / "state.db"
    url = f"sqlite:///{db}"
    spec = (f'name = "ck"\n[job]\ncommand = "true"\nnodes = 1\ngpus_per_node = 0\n'
            f'[checkpoint]\ndir = {json.dumps(str(ckpt))}\nlayout = "generic"\ninterval = "1h"\n')
    with open_store(url) as store:
        store.create_run("ck-1", "ck", spec, NOW)
        cs = store.checkpoints
        found = load_layout("generic").list_checkpoints(str(ckpt))
        cs.record_listing("ck-1", found, NOW)
        for c in found[:5]:
            cs.record_verification("ck-1", c.path, True, NOW)
            cs.record_replica("ck-1", c.path, "s3", c.step != 20, NOW)
    cfg = tmp_path / "b300.toml"
    cfg.write_text(f'[daemon]\nstate_dir = {json.dumps(str(tmp_path))}\ndatabase_url = {json.dumps(url)}\n')
    return cfg, ckpt


def _ctl(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "b300.cli", "--config", str(cfg), *args],
                          capture_output=True, text=True, timeout=60, check=False)


def test_checkpoints_lists_verified_replicated_and_the_next_prune(tmp_path: Path) -> None:
    cfg, _ckpt = _setup(tmp_path)
    proc = _ctl(cfg, "checkpoints", "ck-1", "--json", "--keep-last", "2")
    assert proc.returncode == 0, proc.stderr
    (report,) = json.loads(proc.stdout)
    rows = {r["step"]: r for r in report["checkpoints"]}
    assert rows[10]["verified"] is True and rows[10]["replicated_to"] == ["s3"]
    assert rows[60]["complete"] is False and rows[60]["next_prune"] == "keep"
    # 20 is not on s3 yet: kept; 40, 50 are the newest 2; 10 and 30 go.
    assert sorted(Path(p).name for p in report["would_delete"]) == ["step_10", "step_30"]



def test_table_and_prune_dry_run_unless_confirmed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg, ckpt = _setup(tmp_path)
    assert main(["--config", str(cfg), "checkpoints", "ck-1", "--keep-last", "2"]) == 0
    out = capsys.readouterr().out
    assert "not replicated to s3" in out and "STEP" in out and "next prune deletes 2" in out
    assert main(["--config", str(cfg), "checkpoints", "ck-1", "--keep-last", "2", "--prune"]) == 0
    assert "would delete 2" in capsys.readouterr().out
    assert len(list(ckpt.iterdir())) == 6


def test_a_confirmed_prune_is_the_daemons_and_nothing_is_deleted_without_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--prune --yes is a request to b300d (tests/ops/test_ctl_live.py prunes through a
    running one); b300ctl itself neither deletes nor writes to the store."""
    cfg, ckpt = _setup(tmp_path)
    with open_store(f"sqlite:///{tmp_path / 'state.db'}") as store:
        before = store.events(run_id="ck-1")
    assert main(["--config", str(cfg), "checkpoints", "ck-1", "--keep-last", "2", "--prune", "--yes"]) == 5
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "b300d is not running" in err, err
    assert len(list(ckpt.iterdir())) == 6
    with open_store(f"sqlite:///{tmp_path / 'state.db'}") as store:
        assert store.events(run_id="ck-1") == before


def test_bad_input_is_one_line_with_exit_code_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg, _ = _setup(tmp_path)
    for args in (["checkpoints", "nope"], ["checkpoints", "--prune"],
                 ["checkpoints", "ck-1", "--keep-last", "0"],
                 ["checkpoints", "ck-1", "--keep-daily-for", "soon"]):
        assert main(["--config", str(cfg), *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("b300ctl: "), err
