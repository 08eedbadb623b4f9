"""Train a tiny model on CPU with our progress callback, as a job would.

``python train_with_callback.py hf|lightning OUT_DIR PROGRESS_PATH``: trains 6 optimizer
steps, saving a checkpoint every 3 and logging the loss every 2, then prints one line
``RESULT {json}`` with what the library itself says it did (its logged losses, the
checkpoints it wrote), which the test compares with the progress file. The model is
built from a config: nothing is downloaded. Runs in its own process so each library
initialises as in a job (and its warnings stay out of pytest's warnings-as-errors).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from typing import Any

warnings.filterwarnings("ignore")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def run_hf(out: str, progress: str) -> dict[str, Any]:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from b300.integrations.hf import B300ProgressCallback

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16))
    rows = [torch.arange(i, i + 8) % 64 for i in range(32)]
    data = [{"input_ids": r, "labels": r} for r in rows]
    args = TrainingArguments(output_dir=out, max_steps=6, save_steps=3, logging_steps=2,
                             per_device_train_batch_size=2, report_to=[], use_cpu=True,
                             save_total_limit=None, disable_tqdm=True, dataloader_num_workers=0,
                             include_num_input_tokens_seen="all")
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[B300ProgressCallback(progress)])
    trainer.train()
    return {"losses": {str(e["step"]): e["loss"] for e in trainer.state.log_history if "loss" in e},
            "tokens": trainer.state.num_input_tokens_seen, "global_step": trainer.state.global_step,
            "checkpoints": sorted(d for d in os.listdir(out) if d.startswith("checkpoint-"))}


def run_lightning(out: str, progress: str) -> dict[str, Any]:
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from b300.integrations.lightning import B300ProgressCallback

    losses: dict[str, float] = {}

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, _i: int) -> Any:
            loss = self.layer(batch[0]).pow(2).mean()
            # global_step counts optimizer steps done: this batch's step is the next one.
            losses[str(self.trainer.global_step + 1)] = float(loss.detach())
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self) -> Any:
            ds = torch.utils.data.TensorDataset(torch.randn(64, 8))
            return torch.utils.data.DataLoader(ds, batch_size=4)

    torch.manual_seed(0)
    ckpt = ModelCheckpoint(dirpath=out, every_n_train_steps=3, save_top_k=-1, save_last=False)
    trainer = L.Trainer(max_steps=6, accelerator="cpu", devices=1, logger=False, log_every_n_steps=2,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[B300ProgressCallback(progress), ckpt], default_root_dir=out)
    trainer.fit(Tiny())
    return {"losses": losses, "global_step": trainer.global_step,
            "checkpoints": sorted(f for f in os.listdir(out) if f.endswith(".ckpt")),
            "checkpoint_io": type(trainer.strategy.checkpoint_io).__name__}


def main() -> None:
    kind, out, progress = sys.argv[1:4]
    result = {"hf": run_hf, "lightning": run_lightning}[kind](out, progress)
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
    os._exit(0)  # the libraries may leave non-daemon threads behind
