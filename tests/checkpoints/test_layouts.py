"""Layout plugins on real directories: complete vs torn, symlinks, odd names, real DCP."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from ckpt_fixtures import dcp, deepspeed, generic, megatron, write_file

from b300.checkpoints.layouts import available_layouts, load_layout
from b300.errors import UsageError
from b300.interfaces import CheckpointLayout


def _verdicts(layout: str, root: Path) -> dict[int, bool]:
    return {c.step: c.complete for c in load_layout(layout).list_checkpoints(str(root))}


def test_every_builtin_layout_loads_through_its_entry_point() -> None:
    layouts = available_layouts()
    assert {"dcp", "megatron", "deepspeed", "hf", "lightning", "generic", "auto"} <= set(layouts)
    for name, layout in layouts.items():
        assert isinstance(layout, CheckpointLayout)
        assert layout.name == name


def test_unknown_layout_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="unknown checkpoint layout 'nope'"):
        load_layout("nope")


@pytest.mark.parametrize("layout", ["dcp", "megatron", "deepspeed", "hf", "lightning", "generic", "auto"])
def test_missing_or_unreadable_root_lists_nothing(tmp_path: Path, layout: str) -> None:
    assert load_layout(layout).list_checkpoints(str(tmp_path / "absent")) == []
    (tmp_path / "file").write_text("x")
    assert load_layout(layout).list_checkpoints(str(tmp_path / "file")) == []


def test_dcp_complete_torn_and_accepted_names(tmp_path: Path) -> None:
    dcp(tmp_path, "step_100")
    dcp(tmp_path, "step-200")
    dcp(tmp_path, "checkpoint-300")
    dcp(tmp_path, "iter_0000400")
    dcp(tmp_path, "step_500", metadata=False)  # cut off before .metadata
    d = dcp(tmp_path, "step_600")
    (d / "__1_0.distcp").write_bytes(b"")  # a rank's file truncated
    d = dcp(tmp_path, "step_700")
    (d / ".metadata").write_bytes(b"")
    d = dcp(tmp_path, "step_800")
    (d / "__0_0.distcp").write_bytes(os.urandom(255))  # one byte short of what .metadata records
    (tmp_path / "step_900").mkdir()
    write_file(tmp_path / "unrelated" / ".metadata", b"m")
    (tmp_path / "step_1000").write_text("a file, not a checkpoint")

    found = load_layout("dcp").list_checkpoints(str(tmp_path))
    assert [c.step for c in found] == [100, 200, 300, 400, 500, 600, 700, 800, 900]
    by_step = {c.step: c for c in found}
    assert all(by_step[s].complete for s in (100, 200, 300, 400))
    for s in (500, 600, 700, 800, 900):
        assert not by_step[s].complete and by_step[s].why_incomplete
    assert by_step[800].why_incomplete == "'__0_0.distcp' is 255 bytes, .metadata needs 256"
    ok = by_step[100]
    meta = (tmp_path / "step_100" / ".metadata").stat().st_size
    assert ok.files == 3 and ok.size_bytes == 2 * 256 + meta
    assert ok.mtime == datetime.fromtimestamp(1_700_000_001, UTC)


def test_dcp_data_newer_than_metadata_is_still_complete(tmp_path: Path) -> None:
    """A copy in name order, a restore or a writer's clock ahead: times say nothing about loading."""
    d = dcp(tmp_path, "step_1")
    newer = os.stat(d / ".metadata").st_mtime + 50
    write_file(d / "__0_0.distcp", (d / "__0_0.distcp").read_bytes(), mtime=newer)
    (found,) = load_layout("dcp").list_checkpoints(str(tmp_path))
    assert found.complete, found.why_incomplete


def test_metadata_pickle_is_never_unpickled(tmp_path: Path) -> None:
    """A ``.metadata`` whose pickle would run code when loaded is only read as data."""
    import pickle

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {tmp_path / 'PWNED'}",))

    d = dcp(tmp_path, "step_1")
    (d / ".metadata").write_bytes(pickle.dumps(Evil()))
    (found,) = load_layout("dcp").list_checkpoints(str(tmp_path))
    assert not found.complete and "cannot be read" in found.why_incomplete
    assert not (tmp_path / "PWNED").exists()


# DCP warns that it saves in a single process, which is what this test wants.
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_real_torch_dcp_save_is_complete_and_a_torn_copy_is_not(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("numpy")
    import torch.distributed.checkpoint as dist_cp

    state = {"w": torch.arange(1000, dtype=torch.float32), "b": torch.ones(10)}
    dist_cp.save(state, checkpoint_id=str(tmp_path / "step_10"), no_dist=True)
    torn = tmp_path / "step_20"
    torn.mkdir()
    for f in (tmp_path / "step_10").iterdir():
        if f.suffix == ".distcp":
            (torn / f.name).write_bytes(f.read_bytes())  # data written, .metadata not yet
    assert _verdicts("dcp", tmp_path) == {10: True, 20: False}


def test_megatron_dirs_beyond_the_tracker_are_incomplete(tmp_path: Path) -> None:
    megatron(tmp_path, [1000, 2000, 3000], latest=2000)
    assert _verdicts("megatron", tmp_path) == {1000: True, 2000: True, 3000: False}
    # A torn file below the pointer is caught too.
    (tmp_path / "iter_0001000" / "mp_rank_00" / "model_optim_rng.pt").write_bytes(b"")
    assert _verdicts("megatron", tmp_path) == {1000: False, 2000: True, 3000: False}


def test_megatron_every_tensor_parallel_rank_must_be_there(tmp_path: Path) -> None:
    megatron(tmp_path, [10, 20], latest=20, tp=2)
    import shutil

    shutil.rmtree(tmp_path / "iter_0000020" / "mp_rank_01")
    found = {c.step: c for c in load_layout("megatron").list_checkpoints(str(tmp_path))}
    assert found[10].complete
    assert found[20].why_incomplete == "rank 1 file missing (mp_rank_01/model_optim_rng.pt)"


@pytest.mark.parametrize("tracker", [None, "", "release-candidate", "12abc"])
def test_megatron_without_a_valid_tracker_has_nothing_complete(tmp_path: Path, tracker: str | None) -> None:
    megatron(tmp_path, [10, 20], latest=None)
    if tracker is not None:
        (tmp_path / "latest_checkpointed_iteration.txt").write_text(tracker)
    found = load_layout("megatron").list_checkpoints(str(tmp_path))
    assert [c.complete for c in found] == [False, False]
    assert "latest_checkpointed_iteration.txt" in found[0].why_incomplete


def test_deepspeed_judges_every_rank_not_latest(tmp_path: Path) -> None:
    deepspeed(tmp_path, [5, 10, 15], latest=10)
    assert _verdicts("deepspeed", tmp_path) == {5: True, 10: True, 15: True}
    (tmp_path / "global_step10" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()  # named by latest
    (tmp_path / "latest").write_text("garbage")
    found = {c.step: c for c in load_layout("deepspeed").list_checkpoints(str(tmp_path))}
    assert {s: c.complete for s, c in found.items()} == {5: True, 10: False, 15: True}
    assert found[10].why_incomplete.startswith("rank 1 optimizer file missing")


def test_generic_done_marker(tmp_path: Path) -> None:
    generic(tmp_path, 1)
    generic(tmp_path, 2, done=False)
    d = generic(tmp_path, 3, done=False)
    (d / ".done").write_text("")
    found = load_layout("generic").list_checkpoints(str(tmp_path))
    assert [(c.step, c.complete) for c in found] == [(1, True), (2, False), (3, True)]
    assert found[0].files == 3  # model.pt, opt/state.pt, DONE


def test_symlinks_leaving_the_root_are_never_followed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    generic(outside, 7)
    generic(root, 1)
    os.symlink(outside / "step_7", root / "step_7")  # a checkpoint elsewhere
    os.symlink(outside / "step_7" / "model.pt", root / "step_1" / "stolen.pt")
    os.symlink(root / "step_1", root / "step_1" / "loop")  # inside, but a cycle
    generic(root, 2)
    os.symlink(root / "step_2", root / "step_3")  # inside the root: fine
    found = load_layout("generic").list_checkpoints(str(root))
    assert [c.step for c in found] == [1, 2, 3]
    assert found[0].files == 3  # stolen.pt is not counted
    assert found[2].complete


def test_root_given_through_a_symlink_works(tmp_path: Path) -> None:
    generic(tmp_path / "real", 4)
    os.symlink(tmp_path / "real", tmp_path / "link")
    assert _verdicts("generic", tmp_path / "link") == {4: True}


def test_shell_metacharacters_are_only_data(tmp_path: Path) -> None:
    root = tmp_path / "ckpt $(touch PWNED); `id` & | > ' \""
    d = generic(root, 9)
    write_file(d / "$(touch PWNED2)*?[x]\n", b"data")
    (root / "step_9; rm -rf ~").mkdir()
    (root / "step_\u0661\u0662").mkdir()  # Arabic-Indic digits: not a step
    found = load_layout("generic").list_checkpoints(str(root))
    assert [(c.step, c.complete, c.files) for c in found] == [(9, True, 4)]
    assert not list(tmp_path.rglob("PWNED*"))


def test_a_huge_flat_checkpoint_is_listed(tmp_path: Path) -> None:
    dcp(tmp_path, "step_1", ranks=5_000)  # .metadata names all 5,000 files
    (found,) = load_layout("dcp").list_checkpoints(str(tmp_path))
    assert found.complete and found.files == 5_001
