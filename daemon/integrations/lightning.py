"""Progress protocol v1 from a Lightning ``Trainer``::

    from b300.integrations.lightning import B300ProgressCallback
    trainer = L.Trainer(..., callbacks=[B300ProgressCallback()])  # path from $B300_PROGRESS_FILE

What it writes, from the global rank 0 only: a step line whenever ``trainer.global_step``
reached a multiple of ``every_n_steps`` (``samples``: the batches' first dimension x the
world size, counted since this fit began; ``tokens`` = samples x ``tokens_per_sample``
when given), with ``loss`` from the training step's output every ``loss_every_n_steps``
steps (default: the Trainer's ``log_every_n_steps``; reading a loss waits for the device,
so not every step by default). Checkpoints: the callback wraps the strategy's
``CheckpointIO`` at ``setup``, so ``ckpt_begin``/``ckpt_end`` bracket the actual write
(with its path). An asynchronous CheckpointIO returns before its write ends, so its
``ckpt_end`` is early.

Lightning is imported when ``B300ProgressCallback`` is first used (PEP 562).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

from ._common import batch_length, positive_or_none, rank_zero_writer


def __getattr__(name: str) -> Any:
    if name == "B300ProgressCallback":
        return _callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _callback_class() -> type:
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
    from lightning.pytorch.callbacks import Callback

    class _ProgressCheckpointIO(CheckpointIO):
        """The strategy's own CheckpointIO, with begin/end lines around each save."""

        def __init__(self, inner: Any, owner: Any) -> None:
            self.inner = inner
            self._owner = owner

        def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
            step = int(checkpoint.get("global_step", 0) or 0)
            writer = self._owner.writer
            if writer is not None:
                writer.checkpoint_begin(step, os.fspath(path))
            self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)
            # Only a save that returned is ended: one that raised stays open (and stalls).
            if writer is not None:
                writer.checkpoint_end(step, os.fspath(path))

        def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: Any = None) -> Any:
            return self.inner.load_checkpoint(path, map_location=map_location, weights_only=weights_only)

        def remove_checkpoint(self, path: Any) -> None:
            self.inner.remove_checkpoint(path)

        def teardown(self) -> None:
            self.inner.teardown()

    class B300ProgressCallback(Callback):
        """See :mod:`b300.integrations.lightning`. ``path``: the progress file (``{host}``/
        ``{rank}`` allowed), default ``$B300_PROGRESS_FILE``; without either it does nothing."""

        def __init__(self, path: str | os.PathLike[str] | None = None, *, every_n_steps: int = 1,
                     loss_every_n_steps: int | None = None, tokens_per_sample: int | None = None) -> None:
            self.path = path
            self.every_n_steps = positive_or_none("every_n_steps", every_n_steps) or 1
            self.loss_every_n_steps = positive_or_none("loss_every_n_steps", loss_every_n_steps)
            self.tokens_per_sample = positive_or_none("tokens_per_sample", tokens_per_sample)
            self.writer: Any = None
            self._samples = 0
            self._last_step = -1
            self._io: Any = None

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            if stage != "fit":
                return
            self.writer = rank_zero_writer(self.path, bool(trainer.is_global_zero))
            if self.writer is not None and self._io is None:
                self._io = _ProgressCheckpointIO(trainer.strategy.checkpoint_io, self)
                trainer.strategy.checkpoint_io = self._io
            if self.loss_every_n_steps is None:
                self.loss_every_n_steps = max(1, int(getattr(trainer, "log_every_n_steps", 50) or 50))

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            if self.writer is None:
                return
            self._samples += (batch_length(batch) or 0) * max(1, int(trainer.world_size))
            step = int(trainer.global_step)
            if step == self._last_step or step % self.every_n_steps:
                return
            self._last_step = step
            loss = _loss(outputs) if self.loss_every_n_steps and step % self.loss_every_n_steps == 0 else None
            samples = self._samples or None
            tokens = samples * self.tokens_per_sample if samples and self.tokens_per_sample else None
            self.writer.step(step, loss=loss, samples=samples, tokens=tokens)

        def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
            if self._io is not None and trainer.strategy.checkpoint_io is self._io:
                trainer.strategy.checkpoint_io = self._io.inner
            self._io = None
            if self.writer is not None:
                self.writer.close()

    return B300ProgressCallback


def _loss(outputs: Any) -> float | None:
    value = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    if value is None:
        return None
    try:
        return float(value.detach()) if hasattr(value, "detach") else float(value)
    except (TypeError, ValueError, RuntimeError):
        return None
