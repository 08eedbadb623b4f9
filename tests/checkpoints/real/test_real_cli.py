"""``b300ctl checkpoints RUN`` as a real process, explaining real libraries' folders."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from conftest import Written

from b300.store import open_store

NOW = datetime.now(UTC)


def _run(tmp_path: Path, layout: str, ckpt: Path) -> Path:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    spec = (f'name = "ck"\n[job]\ncommand = "true"\nnodes = 1\ngpus_per_node = 0\n'
            f'[checkpoint]\ndir = {json.dumps(str(ckpt))}\nlayout = "{layout}"\ninterval = "1h"\n')
    with open_store(url) as store:
        store.create_run("ck-1", "ck", spec, NOW)
    cfg = tmp_path / "b300.toml"
    cfg.write_text(f'[daemon]\nstate_dir = {json.dumps(str(tmp_path))}\ndatabase_url = {json.dumps(url)}\n')
    return cfg


def _ctl(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "b300.cli", "--config", str(cfg), "checkpoints", "ck-1", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_a_folder_of_another_format_says_what_it_looks_like(written: Written, tmp_path: Path) -> None:
    cfg = _run(tmp_path, "megatron", written.root("hf"))
    proc = _ctl(cfg)
    assert proc.returncode == 0, proc.stderr
    assert "  no checkpoint of layout megatron found; looks like hf (hf 2)\n" in proc.stdout
    (report,) = json.loads(_ctl(cfg, "--json").stdout)
    assert report["checkpoints"] == [] and report["note"].startswith("no checkpoint of layout megatron found")


def test_auto_says_what_it_chose_and_why_a_torn_save_is_unusable(written: Written, tmp_path: Path) -> None:
    root = tmp_path / "ds"
    shutil.copytree(written.root("deepspeed"), root)
    os.unlink(root / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    cfg = _run(tmp_path, "auto", root)
    proc = _ctl(cfg)
    assert proc.returncode == 0, proc.stderr
    assert "auto: looks like deepspeed (deepspeed 3); chose deepspeed" in proc.stdout
    assert "no: rank 1 optimizer file missing (zero_pp_rank_1_mp_rank_00_optim_states.pt)" in proc.stdout
    (report,) = json.loads(_ctl(cfg, "--json").stdout)
    assert report["layout_chosen"] == "deepspeed"
    assert {r["step"]: r["complete"] for r in report["checkpoints"]} == {1: True, 2: False}


def test_a_dcp_folder_without_metadata_says_so(written: Written, tmp_path: Path) -> None:
    root = tmp_path / "dcp"
    shutil.copytree(written.root("dcp") / "step_10", root / "step_10")
    os.unlink(root / "step_10" / ".metadata")
    proc = _ctl(_run(tmp_path, "dcp", root))
    assert proc.returncode == 0, proc.stderr
    assert "no: no .metadata (being written or cut off)" in proc.stdout
