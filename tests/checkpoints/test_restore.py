"""``b300ctl checkpoints restore``: which replica it picks (pure), all-or-nothing fetching
(a real filesystem target), and its place in the command line (parser, completion)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from ckpt_fixtures import write_file

from b300.checkpoints.entries import StoredCheckpoint
from b300.checkpoints.fetch import FetchedFile, fetch_replica, unsafe_rel
from b300.checkpoints.layouts import load_layout
from b300.checkpoints.manifest import Manifest, ManifestEntry, ensure_manifest, verify
from b300.checkpoints.replicate import load_target, replicate
from b300.checkpoints.restore_plan import restore_choices
from b300.cli import build_parser
from b300.cli.restore import RESTORE
from b300.errors import TransferError, UsageError
from b300.model import CheckpointInfo

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


def _stored(step: int, replicas: dict[str, bool], pruned: frozenset[str] = frozenset()) -> StoredCheckpoint:
    info = CheckpointInfo(f"/ckpt/step_{step}", step, NOW, True)
    return StoredCheckpoint("r", info, True, NOW, False, replicas, replicas_pruned=pruned)


def test_the_newest_verified_copy_first_then_targets_in_config_order() -> None:
    rows = [_stored(10, {"a": True, "b": True}), _stored(30, {"a": False, "b": True}),
            _stored(20, {"a": True}), _stored(40, {"a": True, "b": True}, pruned=frozenset({"a", "b"}))]
    got = [(c.step, c.target, c.name) for c in restore_choices("r", rows, ["a", "b"])]
    assert got == [(30, "b", "step_30"), (20, "a", "step_20"), (10, "a", "step_10"), (10, "b", "step_10")]
    on_a = restore_choices("r", rows, ["a", "b"], target="a")
    assert [(c.step, c.target) for c in on_a] == [(20, "a"), (10, "a")]
    at_10 = restore_choices("r", rows, ["b", "a"], step=10)
    assert [(c.step, c.target) for c in at_10] == [(10, "b"), (10, "a")]


@pytest.mark.parametrize(("kw", "message"), [
    ({"configured": []}, "no offsite target is configured ([[checkpoints.targets]])"),
    ({"target": "c"}, "unknown target 'c' (configured: a, b)"),
    ({"step": 5}, "run r has no checkpoint at step 5 (known steps, newest first: 40, 30, 20, 10)"),
    ({"step": 40}, "step 40 of run r has no verified replica on any target (a, b)"),
    ({"step": 30, "target": "a"}, "step 30 of run r has no verified replica on a"),
])
def test_what_cannot_be_restored_is_named(kw: dict[str, object], message: str) -> None:
    rows = [_stored(10, {"a": True}), _stored(20, {"b": True}), _stored(30, {"b": True}),
            _stored(40, {"a": True}, pruned=frozenset({"a"}))]
    configured = kw.pop("configured", ["a", "b"])
    with pytest.raises(UsageError) as exc:
        restore_choices("r", rows, configured, **kw)  # type: ignore[arg-type]
    assert str(exc.value) == message


def test_unsafe_paths_in_a_record_are_never_written() -> None:
    for rel in ("../x", "/etc/passwd", "a//b", "a/./b", ".b300-manifest.json", "d/.b300-replica.json", "a\0b"):
        assert unsafe_rel(rel), rel
    assert not unsafe_rel("model/__0_0.distcp") and not unsafe_rel(".metadata")


def _replica(tmp_path: Path, files: int = 6) -> tuple[object, Manifest]:
    d = tmp_path / "src" / "step_5"
    for i in range(files):
        write_file(d / "shard" / f"__{i}_0.distcp", os.urandom(300_000 + i))
    write_file(d / "DONE", b"")
    (ck,) = load_layout("generic").list_checkpoints(str(tmp_path / "src"))
    manifest = ensure_manifest(ck.path, NOW)
    target = load_target("filesystem", {"path": str(tmp_path / "offsite")})
    assert replicate(ck, manifest, target).ok
    return target, manifest


def test_an_interrupted_fetch_leaves_nothing_behind(tmp_path: Path) -> None:
    target, manifest = _replica(tmp_path)
    seen: list[str] = []

    def interrupt(f: FetchedFile) -> None:
        seen.append(f.rel)
        if len(seen) == 2:
            raise KeyboardInterrupt  # what Ctrl-C (or SIGTERM, in b300ctl) raises in the main thread

    dest = tmp_path / "out" / "step_5"
    with pytest.raises(KeyboardInterrupt):
        fetch_replica(target, "step_5", manifest, str(dest), concurrency=2, on_file=interrupt)  # type: ignore[arg-type]
    assert sorted(os.listdir(tmp_path / "out")) == []
    result = fetch_replica(target, "step_5", manifest, str(dest), concurrency=3)  # type: ignore[arg-type]
    assert (result.files, result.bytes) == (len(manifest.files), manifest.size_bytes)
    assert verify(str(dest)).ok and sorted(os.listdir(tmp_path / "out")) == ["step_5"]


def test_a_record_naming_a_path_outside_the_folder_is_refused(tmp_path: Path) -> None:
    target, manifest = _replica(tmp_path, files=1)
    evil = Manifest(files=(*manifest.files, ManifestEntry("../escape", 1, "0" * 64)), created_at=NOW)
    with pytest.raises(TransferError, match=r"unsafe path '\.\./escape'"):
        fetch_replica(target, "step_5", evil, str(tmp_path / "out"))  # type: ignore[arg-type]
    assert not (tmp_path / "out").exists() and not (tmp_path / "escape").exists()


def test_restore_is_a_subcommand_beside_the_listing_and_its_run_argument() -> None:
    parser = build_parser()
    args = parser.parse_args(["checkpoints", "restore", "r-1", "--to", "/x", "--step", "7"])
    assert args.command_record is RESTORE
    assert (args.run, args.to, args.step, args.target) == ("r-1", "/x", 7, None)
    args = parser.parse_args(["checkpoints", "r-1", "--keep-last", "2"])
    assert args.command_record.name == "checkpoints" and (args.run, args.keep_last) == ("r-1", 2)
    args = parser.parse_args(["checkpoints", "--keep-last", "2", "r-1", "--prune"])
    assert (args.run, args.keep_last, args.prune) == ("r-1", 2, True)
    args = parser.parse_args(["checkpoints"])
    assert args.command_record.name == "checkpoints" and args.run is None


def test_help_and_completion_know_restore(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "b300.cli"]
    helped = subprocess.run([*run, "checkpoints", "restore", "--help"], capture_output=True, text=True,
                            timeout=60, check=True).stdout
    assert "--to DIR" in helped and "--target NAME" in helped and "--step N" in helped
    assert "6 the\ncopy failed" in helped
    listed = subprocess.run([*run, "checkpoints", "--help"], capture_output=True, text=True, timeout=60,
                            check=True).stdout
    assert "{restore} ... | [run]" in listed
    script = tmp_path / "b300ctl.bash"
    script.write_text(subprocess.run([*run, "completion", "bash"], capture_output=True, text=True, timeout=60,
                                     check=True).stdout)

    def complete(*words: str) -> list[str]:
        probe = (f"source {script}; COMP_WORDS=({' '.join(repr(w) for w in ('b300ctl', *words))}); "
                 f"COMP_CWORD={len(words)}; _b300ctl; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
        return subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30,
                              check=True).stdout.split()

    assert complete("checkpoints", "") == ["restore"]
    assert complete("checkpoints", "re") == ["restore"]
    assert complete("checkpoints", "restore", "ck-1", "--t") == ["--target", "--to"]
    assert "--keep-last" in complete("checkpoints", "--k") and "--to" not in complete("checkpoints", "--t")
