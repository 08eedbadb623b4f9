"""The HF transformers and Lightning callbacks, run by the real libraries on CPU.

transformers 5.24.0 (+ accelerate 1.15.0) and lightning 2.6.6, pinned in the ``[test]``
extra. ``train_with_callback.py`` trains a tiny model built from a config (nothing is
downloaded) in its own process and prints what the library itself recorded; the
progress file is read back with our tailer and compared with that.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from b300.training.protocol import CheckpointEvent, ProgressRecord
from b300.training.reader import ProgressTailer

SCRIPT = Path(__file__).with_name("train_with_callback.py")
TIMEOUT_S = int(os.environ.get("B300_LIB_TIMEOUT_S", "240"))


def _train(kind: str, tmp: Path, *, ranks: int = 1) -> tuple[dict[str, Any], list[ProgressRecord], Path]:
    out = tmp / "out"
    progress = tmp / "progress.{rank}.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("B300_PROGRESS_FILE", None)
    procs = []
    port = _free_port()
    for rank in range(ranks):
        if ranks > 1:
            env = {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(ranks),
                   "RANK": str(rank), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(ranks)}
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT), kind, str(out), str(progress)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for proc in procs:
            text, _ = proc.communicate(timeout=TIMEOUT_S)
            outputs.append(text)
            assert proc.returncode == 0, f"{kind} training exited {proc.returncode}:\n{text[-3000:]}"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    result = json.loads(next(line for line in outputs[0].splitlines() if line.startswith("RESULT "))[7:])
    zero = tmp / "progress.0.jsonl"
    read = ProgressTailer(str(zero)).poll(0)
    assert read.problems == () and not read.missing, read
    return result, list(read.records), tmp


def _free_port() -> int:
    base = int(os.environ.get("B300_PORT_BASE", "17800")) + 300
    for port in range(base, base + 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    pytest.fail("no free port for the gloo rendezvous")


def _checks_common(records: list[ProgressRecord], result: dict[str, Any], ckpt_paths: list[str]) -> None:
    # HF writes the loss in a line of its own at its log steps; Lightning in the step's line.
    steps = [r for r in records if r.event is None]
    assert sorted({r.step for r in steps}) == [1, 2, 3, 4, 5, 6]
    assert [r.step for r in steps] == sorted(r.step for r in steps)
    assert [r.time for r in records] == sorted(r.time for r in records)
    losses = {str(r.step): r.loss for r in records if r.loss is not None}
    assert losses == pytest.approx({k: v for k, v in result["losses"].items() if int(k) in (2, 4, 6)})
    samples = [r.samples for r in steps]
    assert all(s is not None for s in samples) and samples == sorted(samples)
    events = [(r.event, r.step, r.path) for r in records if r.event is not None]
    assert events == [(CheckpointEvent.BEGIN, 3, ckpt_paths[0]), (CheckpointEvent.END, 3, ckpt_paths[0]),
                      (CheckpointEvent.BEGIN, 6, ckpt_paths[1]), (CheckpointEvent.END, 6, ckpt_paths[1])]


def test_hf_trainer_callback(tmp_path: Path) -> None:
    result, records, tmp = _train("hf", tmp_path)
    assert result["global_step"] == 6 and result["checkpoints"] == ["checkpoint-3", "checkpoint-6"]
    paths = [str(tmp / "out" / name) for name in result["checkpoints"]]
    _checks_common(records, result, paths)
    # The Trainer counted tokens (include_num_input_tokens_seen): 2 rows of 8 tokens a step.
    assert [r.tokens for r in records if r.event is None and r.loss is None] == [16 * s for s in range(1, 7)]
    assert records[-1].tokens is None and result["tokens"] == 96
    # The end comes once the folder holds the Trainer's state (written last).
    for path in paths:
        assert (Path(path) / "trainer_state.json").is_file()


def test_lightning_callback(tmp_path: Path) -> None:
    result, records, tmp = _train("lightning", tmp_path)
    assert result["global_step"] == 6
    assert result["checkpoints"] == ["epoch=0-step=3.ckpt", "epoch=0-step=6.ckpt"]
    assert result["checkpoint_io"] == "TorchCheckpointIO"   # our wrapper was taken off at teardown
    paths = [str(tmp / "out" / name) for name in result["checkpoints"]]
    _checks_common(records, result, paths)
    assert [r.samples for r in records if r.event is None] == [4 * s for s in range(1, 7)]
    assert [r.step for r in records if r.loss is not None] == [2, 4, 6]   # log_every_n_steps=2


def test_hf_trainer_on_two_ranks_writes_from_rank_zero_only(tmp_path: Path) -> None:
    result, records, tmp = _train("hf", tmp_path, ranks=2)
    assert result["global_step"] == 6
    assert not (tmp / "progress.1.jsonl").exists()
    steps = [r for r in records if r.event is None and r.loss is None]
    assert [r.step for r in steps] == [1, 2, 3, 4, 5, 6] and {r.rank for r in records} == {0}
    # Two ranks, 2 rows each a step: the global batch is 4.
    assert [r.samples for r in steps] == [4 * s for s in range(1, 7)]
