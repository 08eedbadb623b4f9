"""Writers of checkpoint directories as the frameworks lay them out, for the tests."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class SshServer:
    port: int
    username: str
    key_filename: str
    known_hosts: str
    base: Path


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str
    bucket: str


def free_port(preferred: int) -> int:
    for port in range(preferred, preferred + 100):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    pytest.fail(f"no free port in {preferred}..{preferred + 99}")


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    pytest.fail(f"{what} did not listen on {port} within {timeout} s")


def write_file(path: Path, data: bytes = b"x" * 64, mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def dcp(root: Path, name: str, *, ranks: int = 2, metadata: bool = True, t: float = 1_700_000_000.0) -> Path:
    """A DCP folder: ``__<rank>_0.distcp`` of 256 bytes per rank and a real ``.metadata``
    (torch's own ``Metadata`` pickle) naming each file's byte range, as ``FileSystemWriter`` does."""
    import pickle

    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, MetadataIndex

    d = root / name
    storage = {}
    for r in range(ranks):
        write_file(d / f"__{r}_0.distcp", os.urandom(256), mtime=t)
        storage[MetadataIndex(f"blob{r}")] = _StorageInfo(f"__{r}_0.distcp", 0, 256)
    if metadata:
        meta = Metadata(state_dict_metadata={f"blob{r}": BytesStorageMetadata() for r in range(ranks)},
                        storage_data=storage)
        write_file(d / ".metadata", pickle.dumps(meta), mtime=t + 1)
    return d


def generic(root: Path, step: int, *, done: bool = True, t: float = 1_700_000_000.0) -> Path:
    d = root / f"step_{step}"
    write_file(d / "model.pt", os.urandom(512), mtime=t)
    write_file(d / "opt" / "state.pt", os.urandom(128), mtime=t)
    if done:
        write_file(d / "DONE", b"", mtime=t + 1)
    return d


def megatron(root: Path, steps: list[int], latest: int | None, *, tp: int = 1) -> None:
    """Megatron-LM's legacy folders: ``iter_N/mp_rank_TT/model_optim_rng.pt`` (a ``torch.save``
    with the run's ``args``) per tensor-parallel rank, and the tracker."""
    import argparse

    import torch

    for s in steps:
        for t in range(tp):
            path = root / f"iter_{s:07d}" / f"mp_rank_{t:02d}" / "model_optim_rng.pt"
            path.parent.mkdir(parents=True, exist_ok=True)
            args = argparse.Namespace(tensor_model_parallel_size=tp, pipeline_model_parallel_size=1)
            torch.save({"args": args, "iteration": s, "model": {"w": torch.ones(8)}}, path)
    if latest is not None:
        (root / "latest_checkpointed_iteration.txt").write_text(f"{latest}\n")


def deepspeed(root: Path, steps: list[int], latest: int | None, *, dp: int = 2) -> None:
    """DeepSpeed ZeRO-1 folders as ``save_checkpoint`` names them: rank 0's engine state
    (``dp_world_size``...) and every data-parallel rank's optimizer file (``torch.save`` zips)."""
    import torch

    for s in steps:
        d = root / f"global_step{s}"
        d.mkdir(parents=True, exist_ok=True)
        torch.save({"module": {"w": torch.ones(4)}, "optimizer": None, "dp_world_size": dp, "mp_world_size": 1,
                    "ds_config": {"zero_optimization": {"stage": 1}}, "global_steps": s},
                   d / "mp_rank_00_model_states.pt")
        for r in range(dp):
            torch.save({"optimizer_state_dict": {"r": r}}, d / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
    if latest is not None:
        (root / "latest").write_text(f"global_step{latest}")
