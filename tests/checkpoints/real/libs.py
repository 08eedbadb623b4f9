"""Checkpoints written and loaded by the real libraries on CPU, one process per rank.

``python libs.py save KIND DIR`` writes checkpoints as the library does;
``python libs.py load KIND ROOT PATH...`` asks the library's own loader to load
each PATH and prints one JSON line ``{path: "" or the error}``. The tests run
both through :func:`run` (two ranks on a gloo group where the kind is
distributed). Nothing here imports b300: the oracle must not share our code.

Kinds: dcp, dcp-async, dcp-nocoll (torch 2.13 ``torch.distributed.checkpoint``),
mcore, mcore-async (megatron-core 0.16.1 ``dist_checkpointing``), megatron-legacy
(Megatron-LM's per-rank file order, reproduced: Megatron-LM itself is not a
package), deepspeed (0.19.8, ZeRO-1, ``DS_ACCELERATOR=cpu``), hf (transformers
5.24.0 ``Trainer``), lightning (2.6.6).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from typing import Any

warnings.filterwarnings("ignore")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

DISTRIBUTED = {"dcp", "dcp-async", "dcp-nocoll", "mcore", "mcore-async", "deepspeed"}


def _init() -> tuple[int, int]:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def _dcp_state(rank: int, step: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(step)  # replicated, as data-parallel ranks hold it
    return {"model": {"w": torch.randn(256, 64, generator=g), "b": torch.full((64,), float(step))},
            "step": step}


# -- torch DCP -------------------------------------------------------------------------


def save_dcp(kind: str, root: str) -> None:
    import torch.distributed.checkpoint as dcp

    rank, _ = _init()
    for step in (10, 20):
        path = os.path.join(root, f"step_{step}")
        state = _dcp_state(rank, step)
        if kind == "dcp":
            dcp.save(state, checkpoint_id=path)
        elif kind == "dcp-async":
            dcp.async_save(state, checkpoint_id=path).result(timeout=120)
        else:
            dcp.save(state, checkpoint_id=path, use_collectives=False)


def load_dcp(kind: str, paths: list[str]) -> dict[str, str]:
    import torch.distributed.checkpoint as dcp

    rank, _ = _init()
    out = {}
    for path in paths:
        step = int(path.rstrip("/").rsplit("_", 1)[-1])
        state = _dcp_state(rank, 0)
        state["model"]["w"].zero_()
        try:
            dcp.load(state, checkpoint_id=path)
            expected = _dcp_state(rank, step)
            ok = bool((state["model"]["w"] == expected["model"]["w"]).all())
            out[path] = "" if ok and float(state["model"]["b"][0]) == step else "loaded wrong values"
        except BaseException as exc:
            out[path] = f"{type(exc).__name__}: {exc}"[:300]
    return out


# -- megatron-core dist_checkpointing ----------------------------------------------------------


def _mcore_state(rank: int, world: int, step: int) -> dict[str, Any]:
    import torch
    from megatron.core.dist_checkpointing import ShardedTensor

    g = torch.Generator().manual_seed(step)
    full = torch.randn(world * 32, 16, generator=g)
    local = full[rank * 32:(rank + 1) * 32].clone()
    return {"w": ShardedTensor.from_rank_offsets("w", local, (0, rank, world)), "iteration": step}


def _no_cuda_sync() -> None:
    """megatron-core 0.16.1 assumes CUDA in its save path: it calls ``torch.cuda.synchronize()``
    after staging tensors (``strategies/filesystem_async.py:230``, ``async_utils.py:212``) and
    makes its one-element status tensors for the failure broadcast on
    ``torch.cuda.current_device()`` (``state_dict_saver.py:252``, ``async_utils.py:165,604``).
    With a CPU build of torch both raise. Here synchronize is a no-op (no device work to wait
    for) and the status tensors go on the CPU (gloo broadcasts them); every file is still
    written by megatron-core's own code, in its own order."""
    import torch

    if not torch.cuda.is_available():
        torch.cuda.synchronize = lambda *a, **k: None
        torch.cuda.current_device = lambda: "cpu"


def save_mcore(kind: str, root: str) -> None:
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

    _no_cuda_sync()
    rank, world = _init()
    queue = AsyncCallsQueue() if kind == "mcore-async" else None
    for step in (10, 20):
        path = os.path.join(root, f"iter_{step:07d}")
        os.makedirs(path, exist_ok=True)
        import torch.distributed as dist

        dist.barrier()
        if queue is None:
            dist_checkpointing.save(_mcore_state(rank, world, step), path)
        else:
            request = dist_checkpointing.save(_mcore_state(rank, world, step), path, async_sharded_save=True)
            queue.schedule_async_request(request)
            queue.maybe_finalize_async_calls(blocking=True, no_dist=False)
    if queue is not None:
        queue.close()


def load_mcore(paths: list[str]) -> dict[str, str]:
    import torch
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.core import check_is_distributed_checkpoint

    _no_cuda_sync()
    rank, world = _init()
    out = {}
    for path in paths:
        try:
            if not check_is_distributed_checkpoint(path):
                raise RuntimeError("check_is_distributed_checkpoint says no")
            step = int(path.rstrip("/").rsplit("_", 1)[-1])
            template = _mcore_state(rank, world, step)
            expected = template["w"].data.clone()
            template["w"].data.zero_()
            loaded = dist_checkpointing.load(template, path)
            out[path] = "" if torch.equal(loaded["w"], expected) else "loaded wrong values"
        except BaseException as exc:
            out[path] = f"{type(exc).__name__}: {exc}"[:300]
    return out


# -- Megatron-LM legacy (file order reproduced from megatron/training/checkpointing.py) -------


def save_megatron_legacy(root: str, tp: int = 2) -> None:
    """What Megatron-LM's ``save_checkpoint`` leaves for the legacy (``torch``) format:
    every rank ``torch.save``s ``iter_{N:07d}/mp_rank_{tp:02d}/model_optim_rng.pt``
    (``args``, ``iteration``, ``model``, ``optimizer``, ``rng_state``...), a barrier,
    then rank 0 writes ``latest_checkpointed_iteration.txt``, then
    ``save_tokenizer_assets`` adds ``iter_N/tokenizer/*`` (after the tracker)."""
    import torch

    for step in (10, 20):
        for t in range(tp):
            d = os.path.join(root, f"iter_{step:07d}", f"mp_rank_{t:02d}")
            os.makedirs(d, exist_ok=True)
            args = argparse.Namespace(tensor_model_parallel_size=tp, pipeline_model_parallel_size=1,
                                      iteration=step)
            torch.save({"args": args, "checkpoint_version": 3.0, "iteration": step,
                        "model": {"w": torch.full((64, 8), float(step + t))}, "rng_state": [{}]},
                       os.path.join(d, "model_optim_rng.pt"))
        with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as fh:
            fh.write(str(step))
        tok = os.path.join(root, f"iter_{step:07d}", "tokenizer")
        os.makedirs(tok, exist_ok=True)
        with open(os.path.join(tok, "tokenizer.json"), "w") as fh:
            json.dump({"model": {"type": "BPE"}, "step": step}, fh)


def load_megatron_legacy(root: str, paths: list[str]) -> dict[str, str]:
    """Megatron-LM's ``load_checkpoint`` for the legacy format: the tracker names the iteration
    (or ``release``), then every tensor-parallel rank ``torch.load``s its own file."""
    import torch

    out = {}
    for path in paths:
        try:
            tracker = os.path.join(os.path.dirname(path.rstrip("/")), "latest_checkpointed_iteration.txt")
            with open(tracker) as fh:
                text = fh.read().strip()
            name = os.path.basename(path.rstrip("/"))
            if text == "release":
                if name != "release":
                    raise RuntimeError("the tracker says release")
            elif name == "release" or int(name.split("_")[1]) > int(text):
                raise RuntimeError(f"the tracker says {text}")
            first = torch.load(os.path.join(path, "mp_rank_00", "model_optim_rng.pt"), weights_only=False)
            for t in range(first["args"].tensor_model_parallel_size):
                torch.load(os.path.join(path, f"mp_rank_{t:02d}", "model_optim_rng.pt"), weights_only=False)
            out[path] = ""
        except BaseException as exc:
            out[path] = f"{type(exc).__name__}: {exc}"[:300]
    return out


# -- DeepSpeed ---------------------------------------------------------------------------------


def _ds_engine() -> Any:
    import deepspeed
    import deepspeed.ops
    import torch

    # The optional shared-memory collective is a C++ extension built at first use (a minute on
    # two cores); gloo does the same job for two CPU ranks.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 16)
    cfg = {"train_batch_size": 2, "zero_optimization": {"stage": 1},
           "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine


def save_deepspeed(root: str) -> None:
    import torch

    engine = _ds_engine()
    for step in (1, 2):
        loss = engine(torch.randn(1, 64)).sum()
        engine.backward(loss)
        engine.step()
        engine.save_checkpoint(root, tag=f"global_step{step}")


def load_deepspeed(root: str, paths: list[str]) -> dict[str, str]:
    engine = _ds_engine()
    out = {}
    for path in paths:
        try:
            tag = os.path.basename(path.rstrip("/"))
            loaded, _ = engine.load_checkpoint(os.path.dirname(path.rstrip("/")), tag=tag)
            out[path] = "" if loaded else "load_checkpoint returned None"
        except BaseException as exc:
            out[path] = f"{type(exc).__name__}: {exc}"[:300]
    return out


# -- transformers Trainer ---------------------------------------------------------------------


def _hf_trainer(root: str, max_steps: int) -> Any:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16))
    rows = [torch.arange(i, i + 8) % 64 for i in range(16)]
    data = [{"input_ids": r, "labels": r} for r in rows]
    args = TrainingArguments(output_dir=root, max_steps=max_steps, save_steps=1, per_device_train_batch_size=2,
                             report_to=[], use_cpu=True, logging_steps=1000, save_total_limit=None,
                             disable_tqdm=True, dataloader_num_workers=0)
    return Trainer(model=model, args=args, train_dataset=data)


def save_hf(root: str) -> None:
    _hf_trainer(root, 2).train()


def load_hf(root: str, paths: list[str]) -> dict[str, str]:
    import json as _json

    out = {}
    for i, path in enumerate(paths):
        try:
            with open(os.path.join(path, "trainer_state.json")) as fh:
                step = _json.load(fh)["global_step"]
            scratch = os.path.join(root, f".resume-{i}")
            trainer = _hf_trainer(scratch, step + 1)
            trainer.train(resume_from_checkpoint=path)
            out[path] = "" if trainer.state.global_step == step + 1 else "did not resume at its step"
        except BaseException as exc:
            out[path] = f"{type(exc).__name__}: {exc}"[:300]
    return out


# -- Lightning ----------------------------------------------------------------------------------


def _lightning(root: str, max_steps: int) -> tuple[Any, Any]:
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, _i: int) -> Any:
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self) -> Any:
            ds = torch.utils.data.TensorDataset(torch.randn(32, 8))
            return torch.utils.data.DataLoader(ds, batch_size=4)

    torch.manual_seed(0)
    ckpt = ModelCheckpoint(dirpath=root, every_n_train_steps=1, save_top_k=-1, save_last=False)
    trainer = L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[ckpt],
                        default_root_dir=root)
    return trainer, Tiny()


def save_lightning(root: str) -> None:
    trainer, model = _lightning(root, 2)
    trainer.fit(model)


def load_lightning(root: str, paths: list[str]) -> dict[str, str]:
    out = {}
    for i, path in enumerate(paths):
        try:
            scratch = os.path.join(root, f".resume-{i}")
            trainer, model = _lightning(scratch, 3)
            trainer.fit(model, ckpt_path=path)
            out[path] = "" if trainer.global_step == 3 else f"stopped at {trainer.global_step}"
        except BaseException as exc:
            out[path] = f"{type(exc).__name__}: {exc}"[:300]
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["save", "load"])
    p.add_argument("kind")
    p.add_argument("root")
    p.add_argument("paths", nargs="*")
    a = p.parse_args()
    if a.action == "save":
        if a.kind.startswith("dcp"):
            save_dcp(a.kind, a.root)
        elif a.kind.startswith("mcore"):
            save_mcore(a.kind, a.root)
        else:
            {"megatron-legacy": save_megatron_legacy, "deepspeed": save_deepspeed, "hf": save_hf,
             "lightning": save_lightning}[a.kind](a.root)
        return
    if a.kind.startswith("dcp"):
        result = load_dcp(a.kind, a.paths)
    elif a.kind.startswith("mcore"):
        result = load_mcore(a.paths)
    else:
        result = {"megatron-legacy": load_megatron_legacy, "deepspeed": load_deepspeed, "hf": load_hf,
                  "lightning": load_lightning}[a.kind](a.root, a.paths)
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
    os._exit(0)  # some libraries leave non-daemon threads behind (async writers, gloo)
