"""Real libraries' checkpoints, torn the ways training jobs tear them; the oracle is the library.

For every case the project's verdict (the layout's ``complete``) must equal the
library's own: its loader loads the checkpoint (``libs.py load``) exactly when
the project calls it usable. Each case also states which side it must land on,
so a case that stops tearing anything fails too.

How each tear is made (the libraries' write orders, from their sources):

- kill mid-save (DCP, torch 2.13 ``FileSystemWriter.finish``): every rank's
  ``.distcp`` is written, then rank 0 writes ``.metadata.tmp`` and renames it;
  killed before the rename the folder holds the data and ``.metadata.tmp`` or
  nothing more: reproduced by removing/renaming ``.metadata`` of a real save.
- late rank (DeepSpeed 0.19.8 ``engine.save_checkpoint``, engine.py:4960): rank 0
  writes ``latest`` before the final barrier, so a kill while rank 1 still writes
  its ZeRO file leaves ``latest`` naming a folder without
  ``zero_pp_rank_1_mp_rank_00_optim_states.pt``; reproduced by removing that file
  from a real save. A rank cut off mid-file leaves a zip without its directory:
  reproduced by truncating.
- megatron-core async (0.16.1 ``serialization.save``): ``metadata.json`` is
  written by the finalize step after the shards; reproduced by removing it.
- copy / restore / clock skew: the same bytes with other times (``.distcp``
  newer than ``.metadata``), which changes nothing for any loader.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Written, run_lib

from b300.checkpoints.layouts import explain_nothing, load_layout, recognise

Tear = Callable[[Path], None]


def _skew(path: Path, *, data_newer_by: float = 1.0) -> None:
    """Times as a copy in name order or a writer whose clock runs ahead leaves them."""
    base = 1_800_000_000.0
    for i, f in enumerate(sorted(p for p in path.rglob("*") if p.is_file())):
        t = base + i * data_newer_by
        os.utime(f, (t, t))


def _truncate(rel: str) -> Tear:
    def tear(path: Path) -> None:
        f = path / rel
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return tear


def _remove(rel: str) -> Tear:
    def tear(path: Path) -> None:
        os.unlink(path / rel)
    return tear


def _rename(rel: str, to: str) -> Tear:
    def tear(path: Path) -> None:
        os.rename(path / rel, path / to)
    return tear


def _both(first: Tear, second: Tear) -> Tear:
    def tear(path: Path) -> None:
        first(path)
        second(path)
    return tear


def _untouched(_path: Path) -> None:
    pass


def _copy_in_name_order(path: Path) -> None:
    """A copy that writes files in name order with new times (``.metadata`` sorts first)."""
    tmp = path.with_name(path.name + ".src")
    path.rename(tmp)
    for f in sorted(p for p in tmp.rglob("*") if p.is_file()):
        out = path / f.relative_to(tmp)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, out)
    shutil.rmtree(tmp)
    _skew(path, data_newer_by=1.0)


def _judge(written: Written, tmp_path: Path, kind: str, layout: str, name: str,
           cases: dict[str, tuple[Tear, bool, str]], loader_kind: str | None = None) -> None:
    """Tear a copy per case, then compare the project's verdicts with the library loader's."""
    paths: dict[str, Path] = {}
    for case, (tear, _usable, _why) in cases.items():
        path = written.copy(kind, name, tmp_path / case)
        tear(path)
        paths[case] = path
    loaded = run_lib("load", loader_kind or kind, tmp_path, list(paths.values()))
    problems = []
    for case, path in paths.items():
        _tear, usable, why = cases[case]
        listed = {Path(c.path).name: c for c in load_layout(layout).list_checkpoints(str(path.parent))}
        ours = listed.get(path.name)
        assert ours is not None, f"{case}: {layout} does not list {path.name}"
        library_loads = loaded[str(path)] == ""
        if ours.complete != library_loads:
            problems.append(f"{case}: b300 says complete={ours.complete} ({ours.why_incomplete!r}), "
                            f"the library {'loads it' if library_loads else 'fails: ' + loaded[str(path)]}")
        if library_loads != usable:
            problems.append(f"{case}: expected the library to {'load' if usable else 'refuse'} it, "
                            f"got {loaded[str(path)]!r}")
        if why and why not in ours.why_incomplete:
            problems.append(f"{case}: reason {ours.why_incomplete!r} does not say {why!r}")
    assert not problems, "\n".join(problems)


def test_dcp_sync_save_tears(written: Written, tmp_path: Path) -> None:
    _judge(written, tmp_path, "dcp", "dcp", "step_20", {
        "complete": (_untouched, True, ""),
        "copied_in_name_order": (_copy_in_name_order, True, ""),
        "clock_skew": (lambda p: _skew(p, data_newer_by=1.0), True, ""),
        "killed_before_metadata": (_remove(".metadata"), False, "no .metadata"),
        "killed_in_finish": (_rename(".metadata", ".metadata.tmp"), False, ".metadata.tmp"),
        "rank1_file_lost": (_remove("__1_0.distcp"), False, "'__1_0.distcp' named in .metadata is missing"),
        "rank0_file_cut": (_truncate("__0_0.distcp"), False, "'__0_0.distcp' is"),
        "metadata_cut": (_truncate(".metadata"), False, ".metadata cannot be read"),
    })


def test_dcp_async_save_tears(written: Written, tmp_path: Path) -> None:
    _judge(written, tmp_path, "dcp-async", "dcp", "step_20", {
        "complete": (_untouched, True, ""),
        "restored_in_name_order": (_copy_in_name_order, True, ""),
        "killed_before_metadata": (_remove(".metadata"), False, "no .metadata"),
    })


def test_dcp_without_collectives_tears(written: Written, tmp_path: Path) -> None:
    _judge(written, tmp_path, "dcp-nocoll", "dcp", "step_10", {
        "complete": (_untouched, True, ""),
        "clock_skew": (lambda p: _skew(p, data_newer_by=2.0), True, ""),
        "late_rank1": (_remove("__1.metadata"), False, "rank 1 wrote data but no __1.metadata"),
        "rank1_data_cut": (_truncate("__1_0.distcp"), False, "'__1_0.distcp' is"),
    })


def test_deepspeed_tears(written: Written, tmp_path: Path) -> None:
    _judge(written, tmp_path, "deepspeed", "deepspeed", "global_step2", {
        "complete": (_untouched, True, ""),
        "copied_in_name_order": (_copy_in_name_order, True, ""),
        "late_rank1": (_remove("zero_pp_rank_1_mp_rank_00_optim_states.pt"), False,
                       "rank 1 optimizer file missing"),
        "rank1_cut_mid_file": (_truncate("zero_pp_rank_1_mp_rank_00_optim_states.pt"), False,
                               "zero_pp_rank_1_mp_rank_00_optim_states.pt: not a complete zip"),
        "model_states_cut": (_truncate("mp_rank_00_model_states.pt"), False, "not a complete zip"),
    })


def test_deepspeed_torn_save_is_never_chosen_though_latest_names_it(written: Written, tmp_path: Path) -> None:
    """The issue's case: ``latest`` names global_step2, rank 1's optimizer file is missing."""
    from b300.checkpoints.resume import choose_resume

    root = tmp_path / "ds"
    written.copy("deepspeed", "global_step1", root)
    torn = written.copy("deepspeed", "global_step2", root)
    shutil.copy(written.root("deepspeed") / "latest", root / "latest")
    assert (root / "latest").read_text().strip() == "global_step2"
    os.unlink(torn / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    found = load_layout("deepspeed").list_checkpoints(str(root))
    chosen = choose_resume(found, lambda c: True)
    assert chosen is not None and chosen.step == 1
    assert run_lib("load", "deepspeed", root, [torn])[str(torn)].startswith("FileNotFoundError")


def test_megatron_core_dist_tears(written: Written, tmp_path: Path) -> None:
    cases: dict[str, tuple[Tear, bool, str]] = {
        "complete": (_untouched, True, ""),
        "restored_in_name_order": (_copy_in_name_order, True, ""),
        "before_finalize": (_remove("metadata.json"), False, "no metadata.json"),
        "shard_lost": (_remove("__1_0.distcp"), False, "'__1_0.distcp' named in .metadata is missing"),
        "common_cut": (_truncate("common.pt"), False, "common.pt: not a complete zip"),
    }
    _judge(written, tmp_path / "sync", "mcore", "megatron", "iter_0000020", cases)
    _judge(written, tmp_path / "async", "mcore-async", "megatron", "iter_0000010", {
        k: cases[k] for k in ("complete", "before_finalize")})


def test_megatron_core_dist_under_layout_dcp_needs_metadata_json(written: Written, tmp_path: Path) -> None:
    """A ``layout = "dcp"`` pointed at megatron-core folders judges them as megatron-core does."""
    _judge(written, tmp_path, "mcore-async", "dcp", "iter_0000020", {
        "complete": (_untouched, True, ""),
        "before_finalize": (_remove("metadata.json"), False, "no metadata.json"),
    }, loader_kind="mcore-async")


def test_megatron_legacy_tears(written: Written, tmp_path: Path) -> None:
    def with_tracker(text: str | None) -> Tear:
        def tear(path: Path) -> None:
            if text is not None:
                (path.parent / "latest_checkpointed_iteration.txt").write_text(text)
        return tear

    cases: dict[str, tuple[Tear, bool, str]] = {
        "complete": (with_tracker("20"), True, ""),
        "tracker_missing": (with_tracker(None), False, "no valid latest_checkpointed_iteration.txt"),
        "tracker_behind": (with_tracker("10"), False, "newer than latest_checkpointed_iteration.txt"),
        "rank1_missing": (_both(with_tracker("20"), lambda p: shutil.rmtree(p / "mp_rank_01")), False,
                          "rank 1 file missing"),
        "rank0_cut": (_both(with_tracker("20"), _truncate("mp_rank_00/model_optim_rng.pt")), False,
                      "not a complete zip"),
    }
    _judge(written, tmp_path, "megatron-legacy", "megatron", "iter_0000020", cases)
    # release: the tracker says "release" and the folder is release/.
    root = tmp_path / "release_case"
    src = written.copy("megatron-legacy", "iter_0000010", root)
    src.rename(root / "release")
    (root / "latest_checkpointed_iteration.txt").write_text("release\n")
    (found,) = load_layout("megatron").list_checkpoints(str(root))
    assert found.step == 0 and found.complete, found.why_incomplete
    assert run_lib("load", "megatron-legacy", root, [root / "release"]) == {str(root / "release"): ""}


def test_hf_trainer_tears(written: Written, tmp_path: Path) -> None:
    _judge(written, tmp_path, "hf", "hf", "checkpoint-2", {
        "complete": (_untouched, True, ""),
        "copied_in_name_order": (_copy_in_name_order, True, ""),
        "killed_before_trainer_state": (_remove("trainer_state.json"), False, "no trainer_state.json"),
        "weights_cut": (_truncate("model.safetensors"), False, "model.safetensors:"),
    })


def test_lightning_tears(written: Written, tmp_path: Path) -> None:
    _judge(written, tmp_path, "lightning", "lightning", "epoch=0-step=2.ckpt", {
        "complete": (_untouched, True, ""),
        "cut": (_truncate(""), False, "not a complete zip"),
    })


@pytest.mark.parametrize(("kind", "expected"), [
    ("dcp", "dcp"), ("dcp-nocoll", "dcp"), ("mcore", "megatron"), ("megatron-legacy", "megatron"),
    ("deepspeed", "deepspeed"), ("hf", "hf"), ("lightning", "lightning")])
def test_auto_recognises_each_library_and_says_so(written: Written, kind: str, expected: str) -> None:
    root = written.root(kind)
    chosen, why = recognise(str(root))
    assert chosen == expected and why.startswith(f"looks like {expected}")
    found = load_layout("auto").list_checkpoints(str(root))
    assert found and all(c.complete and c.layout == expected for c in found)
    assert [c.step for c in found] == [c.step for c in load_layout(expected).list_checkpoints(str(root))]


def test_a_folder_of_another_format_is_explained(written: Written) -> None:
    root = str(written.root("hf"))
    assert load_layout("megatron").list_checkpoints(root) == []
    assert explain_nothing("megatron", root) == "no checkpoint of layout megatron found; looks like hf (hf 2)"


def test_megatron_tokenizer_assets_after_the_manifest_keep_it_ok(written: Written, tmp_path: Path) -> None:
    """Megatron-LM writes ``tokenizer/`` after the tracker: a manifest made in between survives."""
    from datetime import UTC, datetime

    from b300.checkpoints.manifest import ensure_manifest, read_manifest, verify

    root = tmp_path / "run"
    path = written.copy("megatron-legacy", "iter_0000020", root)
    (root / "latest_checkpointed_iteration.txt").write_text("20")
    tokenizer = (path / "tokenizer" / "tokenizer.json").read_bytes()
    shutil.rmtree(path / "tokenizer")  # the moment between the tracker and save_tokenizer_assets
    (found,) = load_layout("megatron").list_checkpoints(str(root))
    assert found.complete
    ensure_manifest(found.path, datetime.now(UTC))
    (path / "tokenizer").mkdir()
    (path / "tokenizer" / "tokenizer.json").write_bytes(tokenizer)
    assert verify(found.path).ok
    manifest = read_manifest(found.path)
    assert manifest is not None and "tokenizer/tokenizer.json" in {f.rel for f in manifest.files}
