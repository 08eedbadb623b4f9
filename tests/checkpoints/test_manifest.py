"""Manifests on real files: made once, atomic, and corruption makes a resume fall back."""

from __future__ import annotations

import hashlib
import json
import os
from datetime import UTC, datetime
from pathlib import Path

from ckpt_fixtures import generic, write_file

from b300.checkpoints.layouts import load_layout
from b300.checkpoints.manifest import (
    MANIFEST_NAME,
    ensure_manifest,
    read_manifest,
    verify,
)
from b300.checkpoints.resume import choose_resume

NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)


def test_manifest_records_every_file_and_is_made_once(tmp_path: Path) -> None:
    d = generic(tmp_path, 1)
    m = ensure_manifest(str(d), NOW)
    assert [e.rel for e in m.files] == ["DONE", "model.pt", "opt/state.pt"]
    assert m.files[1].sha256 == hashlib.sha256((d / "model.pt").read_bytes()).hexdigest()
    doc = json.loads((d / MANIFEST_NAME).read_text())
    assert doc["version"] == 1 and len(doc["files"]) == 3
    before = os.stat(d / MANIFEST_NAME).st_mtime_ns
    assert ensure_manifest(str(d), datetime(2030, 1, 1, tzinfo=UTC)) == m
    assert os.stat(d / MANIFEST_NAME).st_mtime_ns == before
    assert not (d / (MANIFEST_NAME + ".tmp")).exists()
    # The manifest is not part of the checkpoint the layout lists.
    (ck,) = load_layout("generic").list_checkpoints(str(tmp_path))
    assert ck.files == 3


def test_verify_passes_then_catches_each_kind_of_damage(tmp_path: Path) -> None:
    d = generic(tmp_path, 1)
    assert not verify(str(d)).ok  # no manifest yet
    ensure_manifest(str(d), NOW)
    good = verify(str(d))
    assert good.ok and good.bytes_hashed == 512 + 128

    data = bytearray((d / "model.pt").read_bytes())
    data[10] ^= 0xFF  # same size, one bit flipped
    (d / "model.pt").write_bytes(bytes(data))
    bad = verify(str(d))
    assert not bad.ok and "'model.pt' does not match its sha256" in bad.problems
    assert verify(str(d), full=False).ok  # a size-only check cannot see it

    (d / "opt" / "state.pt").unlink()
    write_file(d / "extra.bin", b"1")
    problems = verify(str(d), full=False).problems
    assert "missing 'opt/state.pt'" in problems and "unexpected file 'extra.bin'" in problems


def test_unreadable_manifest_is_no_manifest(tmp_path: Path) -> None:
    d = generic(tmp_path, 1)
    (d / MANIFEST_NAME).write_text("{not json")
    assert read_manifest(str(d)) is None
    assert verify(str(d)).problems == ("no readable manifest",)


def test_corrupted_newest_checkpoint_makes_resume_fall_back(tmp_path: Path) -> None:
    for step in (100, 200, 300):
        generic(tmp_path, step)
    generic(tmp_path, 400, done=False)  # being written
    layout = load_layout("generic")
    for ck in layout.list_checkpoints(str(tmp_path)):
        if ck.complete:
            ensure_manifest(ck.path, NOW)
    with open(tmp_path / "step_300" / "model.pt", "r+b") as fh:
        fh.seek(100)
        fh.write(b"\x00\x01\x02")

    chosen = choose_resume(layout.list_checkpoints(str(tmp_path)), lambda ck: verify(ck.path).ok)
    assert chosen is not None and chosen.step == 200


def test_files_added_later_extend_the_manifest_but_damage_still_fails(tmp_path: Path) -> None:
    """Megatron-LM writes tokenizer/ after its tracker: a manifest made in between must survive."""
    d = generic(tmp_path, 1)
    ensure_manifest(str(d), NOW)
    write_file(d / "tokenizer" / "tokenizer.json", b'{"model": {}}')
    result = verify(str(d))
    assert result.ok, result.problems
    manifest = read_manifest(str(d))
    assert manifest is not None and "tokenizer/tokenizer.json" in {f.rel for f in manifest.files}
    assert manifest.created_at == NOW
    # An addition beside a changed recorded file is not taken in: the checkpoint fails.
    write_file(d / "tokenizer" / "vocab.txt", b"a b c")
    data = bytearray((d / "model.pt").read_bytes())
    data[0] ^= 0xFF
    (d / "model.pt").write_bytes(bytes(data))
    bad = verify(str(d))
    assert not bad.ok and "'model.pt' does not match its sha256" in bad.problems
    manifest = read_manifest(str(d))
    assert manifest is not None and "tokenizer/vocab.txt" not in {f.rel for f in manifest.files}
