"""Progress protocol v1 from an HF transformers ``Trainer``::

    from b300.integrations.hf import B300ProgressCallback
    trainer = Trainer(..., callbacks=[B300ProgressCallback()])   # path from $B300_PROGRESS_FILE

What it writes, from the global rank 0 only: a step line at every ``every_n_steps``
optimizer step (``samples`` = steps x the global batch; ``tokens`` from the Trainer's
``num_input_tokens_seen`` when it counts them, else ``samples x tokens_per_sample`` when
given); a line with ``loss`` at each of the Trainer's log steps (the mean loss it logs);
``ckpt_begin`` when the Trainer decided to save at this step (``control.should_save``
after its flow callback, which runs first) and ``ckpt_end`` when ``on_save`` says the
checkpoint folder was written. No per-host step time: rank 0's wall time per step
includes waiting for the other ranks, so it would not tell a slow host apart.

transformers is imported when ``B300ProgressCallback`` is first used, not on import of
this module (PEP 562 module ``__getattr__``).
"""

from __future__ import annotations

import functools
import os
from typing import Any

from ._common import positive_or_none, rank_zero_writer


def __getattr__(name: str) -> Any:
    if name == "B300ProgressCallback":
        return _callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _callback_class() -> type:
    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    class B300ProgressCallback(TrainerCallback):
        """See :mod:`b300.integrations.hf`. ``path``: the progress file (``{host}``/``{rank}``
        allowed), default ``$B300_PROGRESS_FILE``; without either the callback does nothing."""

        def __init__(self, path: str | os.PathLike[str] | None = None, *, every_n_steps: int = 1,
                     tokens_per_sample: int | None = None) -> None:
            self.path = path
            self.every_n_steps = positive_or_none("every_n_steps", every_n_steps) or 1
            self.tokens_per_sample = positive_or_none("tokens_per_sample", tokens_per_sample)
            self.writer: Any = None
            self._global_batch = 0
            self._saving: tuple[int, str] | None = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.writer = rank_zero_writer(self.path, bool(state.is_world_process_zero))
            self._global_batch = (args.per_device_train_batch_size * args.gradient_accumulation_steps
                                  * max(1, args.world_size))

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.writer is None:
                return
            step = int(state.global_step)
            if step % self.every_n_steps == 0 or control.should_save:
                self.writer.step(step, **self._counters(state))
            if control.should_save:
                path = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
                self._saving = (step, path)
                self.writer.checkpoint_begin(step, path)

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
                   **kwargs: Any) -> None:
            if self.writer is not None and logs and isinstance(logs.get("loss"), int | float):
                self.writer.step(int(state.global_step), loss=float(logs["loss"]), **self._counters(state))

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.writer is not None and self._saving is not None:
                step, path = self._saving
                self._saving = None
                self.writer.checkpoint_end(step, path)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.writer is not None:
                self.writer.close()

        def _counters(self, state: Any) -> dict[str, int | None]:
            samples = int(state.global_step) * self._global_batch or None
            tokens = int(getattr(state, "num_input_tokens_seen", 0) or 0) or None
            if tokens is None and samples is not None and self.tokens_per_sample:
                tokens = samples * self.tokens_per_sample
            return {"samples": samples, "tokens": tokens}

    return B300ProgressCallback
