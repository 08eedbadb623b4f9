"""When is a checkpoint loadable? Each framework's rule, judged from the checkpoint's contents.

Every rule here answers the question the framework's own loader answers when
it resumes, from what the files say about themselves, never from timestamps
(a copy, a restore or two writers' clocks a second apart change those, not
whether the checkpoint loads). Each returns ``''`` for a loadable checkpoint
or one line saying why it is not ("no .metadata", "rank 1 optimizer file
missing"). Pickled metadata is read with :mod:`b300.checkpoints.peek`, which
never unpickles.

Versions read for these rules: torch 2.13.0 (``torch/distributed/checkpoint``),
deepspeed 0.19.8 (``runtime/engine.py``), megatron-core 0.16.1
(``dist_checkpointing``), Megatron-LM ``megatron/training/checkpointing.py``
(legacy naming), transformers 5.24.0 (``Trainer._save_checkpoint`` /
``_load_from_checkpoint``), lightning 2.6.6 (``ModelCheckpoint``).
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterable
from typing import Any

from .peek import Opaque, PeekError, read_pickle, torch_pickle, zip_problem
from .walk import CheckpointDir, FileEntry

_MAX_META_BYTES = 64 << 20
_MAX_JSON_BYTES = 16 << 20
_RANK_META = re.compile(r"__(\d{1,9})\.metadata", re.ASCII)
_RANK_DATA = re.compile(r"__(\d{1,9})_\d{1,9}\.distcp", re.ASCII)


def _read(path: str, limit: int) -> bytes:
    with open(path, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise PeekError(f"larger than {limit} bytes")
    return data


def _walk_values(value: Any, depth: int = 0) -> Iterable[Any]:
    """Every value nested in dicts, lists, tuples and inert objects (bounded depth)."""
    if depth > 40:
        return
    yield value
    if isinstance(value, dict):
        children: Iterable[Any] = list(value.keys()) + list(value.values())
    elif isinstance(value, (list, tuple)):
        children = value
    elif isinstance(value, Opaque):
        children = [*value.args, value.state, *value.items.values(), *value.appended]
    else:
        return
    for child in children:
        yield from _walk_values(child, depth + 1)


# -- torch.distributed.checkpoint -------------------------------------------------------


def dcp_storage(meta_path: str) -> dict[str, int]:
    """The storage files a DCP metadata file names, with the bytes each must hold at least.

    DCP's ``Metadata.storage_data`` maps every saved item to a ``_StorageInfo``
    (``relative_path``, ``offset``, ``length``); the loader reads exactly those
    ranges. Raises PeekError/OSError when the metadata cannot be read.
    """
    doc = read_pickle(_read(meta_path, _MAX_META_BYTES))
    if not isinstance(doc, Opaque) or not doc.name.endswith(".Metadata"):
        raise PeekError("not a DCP Metadata pickle")
    need: dict[str, int] = {}
    for value in _walk_values(doc.fields().get("storage_data")):
        if isinstance(value, Opaque) and value.name.endswith("._StorageInfo"):
            f = value.fields()
            rel, offset, length = f.get("relative_path"), f.get("offset"), f.get("length")
            if not isinstance(rel, str) or not isinstance(offset, int) or not isinstance(length, int):
                raise PeekError("a _StorageInfo without relative_path/offset/length")
            need[rel] = max(need.get(rel, 0), offset + length)
    return need


def _storage_problem(ckpt: CheckpointDir, meta_rel: str) -> str:
    try:
        need = dcp_storage(os.path.join(ckpt.path, meta_rel))
    except (PeekError, OSError) as exc:
        return f"{meta_rel} cannot be read ({exc})"
    have = {f.rel: f.size for f in ckpt.files}
    for rel, size in sorted(need.items()):
        got = have.get(rel)
        if got is None:
            return f"{rel!r} named in {meta_rel} is missing"
        if got < size:
            return f"{rel!r} is {got} bytes, {meta_rel} needs {size}"
    return ""


def dcp_problem(ckpt: CheckpointDir) -> str:
    """torch DCP: ``.metadata`` (written last, by rename) and every file it names, at its size.

    Saved with ``use_collectives=False`` every rank writes its own
    ``__<rank>.metadata`` instead, and each rank loads its own: then ranks
    0..max must all have one, every rank that wrote data must have one, and
    each names only files that are there. (A rank that never started writing
    leaves no trace in the folder: without collectives nothing records the
    world size.)
    """
    if ckpt.file(".metadata") is not None:
        return _storage_problem(ckpt, ".metadata")
    ranks = sorted(int(m.group(1)) for f in ckpt.files if (m := _RANK_META.fullmatch(f.rel)))
    if not ranks:
        if ckpt.file(".metadata.tmp") is not None:
            return "no .metadata (.metadata.tmp: the save is finishing or was cut off)"
        return "no .metadata (being written or cut off)"
    for expected, rank in enumerate(ranks):
        if rank != expected:
            return f"no __{expected}.metadata (rank {expected} of a save without collectives)"
    writers = {int(m.group(1)) for f in ckpt.files if (m := _RANK_DATA.fullmatch(f.rel))}
    late = sorted(writers - set(ranks))
    if late:
        return f"rank {late[0]} wrote data but no __{late[0]}.metadata (being written or cut off)"
    for rank in ranks:
        why = _storage_problem(ckpt, f"__{rank}.metadata")
        if why:
            return why
    return ""


# -- DeepSpeed ----------------------------------------------------------------------------

_DS_MODEL = re.compile(r"(?:zero_pp_rank_(\d{1,6})_)?mp_rank_(\d{2,6})_model_states\.pt", re.ASCII)
_DS_OPTIM = re.compile(r"(?:bf16_)?zero_pp_rank_(\d{1,6})_mp_rank_(\d{2,6})_?optim_states\.pt", re.ASCII)


def _zero_stage(config: Any) -> int | None:
    if isinstance(config, dict):
        zero = config.get("zero_optimization")
        if isinstance(zero, dict):
            stage = zero.get("stage", 0)
            return stage if isinstance(stage, int) else None
        return 0
    return None


def deepspeed_problem(ckpt: CheckpointDir) -> str:
    """DeepSpeed: the model states of every model-parallel rank and, under ZeRO, the optimizer
    states of every data-parallel rank, each a complete ``torch.save`` zip.

    The world sizes come from the engine state rank 0 saved
    (``mp_rank_00_model_states.pt``: ``dp_world_size``, ``mp_world_size``,
    ``ds_config``), read without unpickling. ``latest`` is not needed: it names
    the tag to load when none is given, and rank 0 writes it before the final
    barrier, so it can name a save another rank has not finished.
    """
    names = {f.rel: f for f in ckpt.files}
    first = names.get("mp_rank_00_model_states.pt") or names.get("zero_pp_rank_0_mp_rank_00_model_states.pt")
    if first is None:
        return "no mp_rank_00_model_states.pt (rank 0's model states)"
    why = zip_problem(os.path.join(ckpt.path, first.rel))
    if why:
        return f"{first.rel}: {why}"
    try:
        state = torch_pickle(os.path.join(ckpt.path, first.rel))
    except PeekError as exc:
        return f"{first.rel} cannot be read ({exc})"
    if not isinstance(state, dict):
        return f"{first.rel} is not DeepSpeed engine state"
    dp, mp = state.get("dp_world_size"), state.get("mp_world_size")
    if not isinstance(dp, int) or not isinstance(mp, int) or dp < 1 or mp < 1:
        return f"{first.rel} records no dp_world_size/mp_world_size"
    zero3 = first.rel.startswith("zero_pp_rank_")
    stage = _zero_stage(state.get("ds_config"))
    # ZeRO saves the optimizer per data-parallel rank, never in the model states.
    optim_expected = state.get("optimizer") is None and (
        stage > 0 if stage is not None else any(_DS_OPTIM.fullmatch(f) for f in names))
    for m in range(mp):
        model_ranks = range(dp) if zero3 else [None]
        for d in model_ranks:
            rel = (f"zero_pp_rank_{d}_" if d is not None else "") + f"mp_rank_{m:02d}_model_states.pt"
            if rel not in names:
                return f"rank {d if d is not None else m} model states missing ({rel})"
        if not optim_expected:
            continue
        for d in range(dp):
            options = [f"{p}zero_pp_rank_{d}_mp_rank_{m:02d}_optim_states.pt" for p in ("", "bf16_")]
            if not any(o in names for o in options):
                return f"rank {d} optimizer file missing ({options[0]})"
    return _torn_zips(ckpt, (f for f in ckpt.files if f.rel.endswith(".pt")))


def _torn_zips(ckpt: CheckpointDir, files: Iterable[FileEntry]) -> str:
    for f in files:
        why = zip_problem(os.path.join(ckpt.path, f.rel))
        if why:
            return f"{f.rel}: {why}"
    return ""


# -- Megatron -----------------------------------------------------------------------------

_MP_DIR = re.compile(r"mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?", re.ASCII)


def megatron_dist_problem(ckpt: CheckpointDir) -> str:
    """megatron-core ``dist_checkpointing``: ``metadata.json`` (rank 0 writes it after every rank's
    shards, in the async finalize step) naming the backend, ``common.pt`` complete, and for
    the ``torch_dist`` backend the DCP rule. This is what ``check_is_distributed_checkpoint``
    and ``dist_checkpointing.load`` need.
    """
    if ckpt.file("metadata.json") is None:
        return "no metadata.json (megatron-core writes it after every shard)"
    try:
        config = json.loads(_read(os.path.join(ckpt.path, "metadata.json"), _MAX_JSON_BYTES))
    except (OSError, PeekError, ValueError) as exc:
        return f"metadata.json cannot be read ({exc})"
    backend = config.get("sharded_backend") if isinstance(config, dict) else None
    if not isinstance(backend, str):
        return "metadata.json names no sharded_backend"
    common = ckpt.file("common.pt")
    if common is None:
        return "no common.pt"
    why = zip_problem(os.path.join(ckpt.path, common.rel))
    if why:
        return f"common.pt: {why}"
    if backend.startswith("torch_dist"):
        return dcp_problem(ckpt)
    return ""


def megatron_legacy_problem(ckpt: CheckpointDir) -> str:
    """Megatron-LM's per-rank files: ``mp_rank_TT[_PPP]/model_optim_rng.pt`` for every
    tensor- and pipeline-parallel rank, sizes from the ``args`` rank 0 saved, each a
    complete ``torch.save`` zip (the tracker is judged by the layout).
    """
    dirs = {}
    for f in ckpt.files:
        top, _, rest = f.rel.partition("/")
        if rest == "model_optim_rng.pt" and _MP_DIR.fullmatch(top):
            dirs[top] = f
    if not dirs:
        return "no mp_rank_*/model_optim_rng.pt"
    first = dirs.get("mp_rank_00") or dirs.get("mp_rank_00_000")
    if first is None:
        return "rank 0 file missing (mp_rank_00/model_optim_rng.pt)"
    why = zip_problem(os.path.join(ckpt.path, first.rel))
    if why:
        return f"{first.rel}: {why}"
    tp = pp = None
    try:
        state = torch_pickle(os.path.join(ckpt.path, first.rel))
        args = state.get("args") if isinstance(state, dict) else None
        if isinstance(args, Opaque):
            fields = args.fields()
            tp, pp = fields.get("tensor_model_parallel_size"), fields.get("pipeline_model_parallel_size")
    except PeekError as exc:
        return f"{first.rel} cannot be read ({exc})"
    if isinstance(tp, int) and isinstance(pp, int) and tp >= 1 and pp >= 1:
        for t in range(tp):
            for p in range(pp):
                name = f"mp_rank_{t:02d}" if pp == 1 else f"mp_rank_{t:02d}_{p:03d}"
                if not any(d == name or d.startswith(name + "_") for d in dirs):
                    return f"rank {t * pp + p} file missing ({name}/model_optim_rng.pt)"
    return _torn_zips(ckpt, (f for f in ckpt.files if f.rel.endswith(".pt")))


# -- Hugging Face Trainer --------------------------------------------------------------------

_HF_WEIGHTS = ("model.safetensors", "adapter_model.safetensors", "pytorch_model.bin", "adapter_model.bin")
_HF_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def safetensors_problem(path: str) -> str:
    """'' when a safetensors file holds its header and every tensor's bytes it declares."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return "shorter than its header"
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, 100 << 20):
                return "header runs past the end of the file"
            header = json.loads(fh.read(n))
    except (OSError, ValueError) as exc:
        return f"unreadable header ({exc})"
    if not isinstance(header, dict):
        return "header is not an object"
    end = 0
    for key, info in header.items():
        if key == "__metadata__" or not isinstance(info, dict):
            continue
        offsets = info.get("data_offsets")
        if isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets):
            end = max(end, offsets[1])
    if 8 + n + end > size:
        return f"{size} bytes, its header needs {8 + n + end}"
    return ""


def _weights_problem(ckpt: CheckpointDir, rel: str) -> str:
    path = os.path.join(ckpt.path, rel)
    why = safetensors_problem(path) if rel.endswith(".safetensors") else zip_problem(path)
    return f"{rel}: {why}" if why else ""


def hf_trainer_problem(ckpt: CheckpointDir) -> str:
    """transformers ``Trainer``: ``trainer_state.json`` (its last file) readable, and the weights
    ``_load_from_checkpoint`` reads: a weights file, or an index and every shard it names, each
    complete; the optimizer, scheduler and RNG files it loads, when present, complete.
    """
    if ckpt.file("trainer_state.json") is None:
        return "no trainer_state.json (the Trainer writes it last)"
    try:
        state = json.loads(_read(os.path.join(ckpt.path, "trainer_state.json"), _MAX_JSON_BYTES))
    except (OSError, PeekError, ValueError) as exc:
        return f"trainer_state.json cannot be read ({exc})"
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
        return "trainer_state.json has no global_step"
    names = {f.rel for f in ckpt.files}
    weights = [w for w in _HF_WEIGHTS if w in names]
    indexes = [i for i in _HF_INDEXES if i in names]
    if not weights and not indexes:
        return "no weights (model.safetensors, pytorch_model.bin or an index)"
    for rel in weights:
        why = _weights_problem(ckpt, rel)
        if why:
            return why
    for index in indexes:
        try:
            doc = json.loads(_read(os.path.join(ckpt.path, index), _MAX_JSON_BYTES))
            shards = sorted(set(doc["weight_map"].values()))
        except (OSError, PeekError, ValueError, KeyError, TypeError, AttributeError) as exc:
            return f"{index} cannot be read ({exc})"
        for shard in shards:
            if not isinstance(shard, str) or shard not in names:
                return f"shard {shard!r} named in {index} is missing"
            why = _weights_problem(ckpt, shard)
            if why:
                return why
    extras = [f for f in ckpt.files if f.rel in ("optimizer.pt", "scheduler.pt", "scaler.pt")
              or (f.rel.startswith("rng_state") and f.rel.endswith(".pth"))]
    return _torn_zips(ckpt, extras)


# -- Lightning ----------------------------------------------------------------------------------


def lightning_ckpt(path: str) -> tuple[int | None, str]:
    """``(global_step, problem)`` of a Lightning ``.ckpt`` file (a ``torch.save`` zip)."""
    why = zip_problem(path)
    if why:
        return None, why
    try:
        state = torch_pickle(path)
    except PeekError as exc:
        return None, f"cannot be read ({exc})"
    if not isinstance(state, dict) or "state_dict" not in state:
        return None, "holds no state_dict (not a Lightning checkpoint)"
    step = state.get("global_step")
    return (step if isinstance(step, int) else None), ""
