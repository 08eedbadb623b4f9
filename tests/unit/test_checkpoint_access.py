"""[checkpoints] roots and the submit-time check of a spec's checkpoint folder (issue 11)."""

from __future__ import annotations

from pathlib import Path

import pytest

from b300.checkpoints.access import checkpoint_dir_problem
from b300.config.tables.checkpoints import parse_checkpoints_config
from b300.errors import ConfigError


def test_roots_parse_and_refuse_what_a_unit_file_cannot_hold() -> None:
    cfg = parse_checkpoints_config({"roots": ["/lustre/ckpt/", "/lustre/ckpt", "/home/a"]}, "c")
    assert cfg.roots == ("/lustre/ckpt", "/home/a")
    for bad in (["relative"], ["/with space"], ["/a/../etc"], ["/"], "/lustre", [1]):
        with pytest.raises(ConfigError, match="roots"):
            parse_checkpoints_config({"roots": bad}, "c")


def test_outside_the_roots_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    assert checkpoint_dir_problem(str(root / "run" / "ckpt"), [str(root)]) is None  # made by the job
    assert checkpoint_dir_problem(str(root), [str(root)]) is None
    why = checkpoint_dir_problem(str(tmp_path / "rootless" / "ckpt"), [str(root)])
    assert why is not None and "outside [checkpoints] roots" in why and "\n" not in why
    # A sibling whose name starts like the root is not inside it.
    assert checkpoint_dir_problem(str(tmp_path / "root2" / "ckpt"), [str(root)]) is not None
    assert checkpoint_dir_problem(str(tmp_path / "x" / "ckpt"), []) is None  # no roots: no place rule
