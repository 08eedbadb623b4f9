"""``ProgressWriter``: the job's side of the progress protocol (standard library only).

One file per host, lines appended with one ``write()`` each::

    writer = ProgressWriter("/lustre/runs/llama/progress.{host}.jsonl")
    for step in ...:
        ...
        writer.step(step, loss=loss, tokens=tokens_seen)
    writer.checkpoint_begin(step, path=ckpt_dir)
    ...save...
    writer.checkpoint_end(step, path=ckpt_dir)

Why one file per host, and ``O_APPEND`` lines of at most 4096 bytes inside it: appends
from several *hosts* to one file on NFS are not atomic (each client computes the end
of the file from its own cached size, so lines from two hosts overwrite each other),
while several *processes of one host* appending a line with a single ``write()`` on an
``O_APPEND`` descriptor are serialised by the kernel on a local filesystem and by the
client on NFS and Lustre. ``{host}`` in the path is the Slurm node name, so the daemon
knows every file of an allocation without listing a folder. Lines are not fsynced:
progress is advisory, and an fsync per step on a parallel filesystem is expensive.

The writer never stops training: an I/O error is logged once and the line dropped
(``strict=True`` raises instead); wrong arguments (a negative step) raise at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from .protocol import MAX_HOST_CHARS, MAX_PATH_CHARS, CheckpointEvent, encode_record

#: The path the daemon gives the job (``{host}``/``{rank}`` may appear in it).
PATH_ENV = "B300_PROGRESS_FILE"
_log = logging.getLogger(__name__)


def default_host() -> str:
    """The Slurm node name where Slurm says it (``SLURMD_NODENAME``), else the short host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0] or "localhost"


def default_rank() -> int | None:
    """The global rank from ``RANK`` (torchrun) or ``SLURM_PROCID`` (srun), if either is a number."""
    for key in ("RANK", "SLURM_PROCID"):
        value = os.environ.get(key, "")
        if value.isascii() and value.isdigit():
            return int(value)
    return None


class ProgressWriter:
    """Appends progress protocol v1 lines to ``path`` (``{host}`` and ``{rank}`` replaced).

    ``host`` and ``rank`` default to the Slurm node name and the global rank; both go
    into every line. ``clock`` gives unix seconds (injected in tests). Not thread-safe:
    one writer per process, used from the training loop."""

    def __init__(self, path: str | os.PathLike[str], *, host: str | None = None,
                 rank: int | None = None, clock: Callable[[], float] = time.time,
                 strict: bool = False) -> None:
        self.host = host if host is not None else default_host()
        self.rank = rank if rank is not None else default_rank()
        if not (0 < len(self.host) <= MAX_HOST_CHARS and self.host.isprintable()):
            raise ValueError(f"host must be 1-{MAX_HOST_CHARS} printable characters, got {self.host!r}")
        text = os.fspath(path)
        # Plain replacement, not str.format: other braces in a path stay as they are.
        self.path = text.replace("{host}", self.host).replace("{rank}", str(self.rank or 0))
        self._clock = clock
        self._strict = strict
        self._fd: int | None = None
        self._warned = False
        self.dropped = 0

    @classmethod
    def from_env(cls, **kwargs: Any) -> ProgressWriter | None:
        """A writer for ``$B300_PROGRESS_FILE``, or None when the job was not given one."""
        path = os.environ.get(PATH_ENV, "")
        return cls(path, **kwargs) if path else None

    # -- records -------------------------------------------------------------------------

    def step(self, step: int, *, loss: float | None = None, tokens: int | None = None,
             samples: int | None = None, step_time_s: float | None = None,
             time: float | None = None) -> bool:
        """Record that ``step`` is done. ``tokens``/``samples``: counted since the attempt (or
        run) began; ``step_time_s``: this host's own work for the step, without waiting
        for other hosts (what tells a slow host apart). True if the line was written."""
        # float()/int() take a framework's 0-d tensors as well as numbers.
        return self._write(step, time, loss=None if loss is None else float(loss),
                           tokens=None if tokens is None else int(tokens),
                           samples=None if samples is None else int(samples),
                           step_time_s=None if step_time_s is None else float(step_time_s))

    def checkpoint_begin(self, step: int, path: str | os.PathLike[str] | None = None) -> bool:
        """A checkpoint save of ``step`` starts (``path``: where it goes)."""
        return self._write(step, None, event=CheckpointEvent.BEGIN.value, path=_path_field(path))

    def checkpoint_end(self, step: int, path: str | os.PathLike[str] | None = None) -> bool:
        """The save of ``step`` is complete on this host."""
        return self._write(step, None, event=CheckpointEvent.END.value, path=_path_field(path))

    def exit_intent(self, step: int, *, restart: bool, why: str = "") -> bool:
        """Tell the daemon, before exiting, whether the run should be resubmitted."""
        return self._write(step, None, exit_intent={"restart": restart, "why": why[:500]})

    # -- file --------------------------------------------------------------------------

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> ProgressWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _write(self, step: int, when: float | None, **fields: Any) -> bool:
        if hasattr(step, "__index__") and not isinstance(step, bool | int):
            step = int(step)
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        line = encode_record({"step": step, "time": self._clock() if when is None else when,
                              "host": self.host, "rank": self.rank, **fields})
        written = 0
        try:
            fd = self._open()
            while written < len(line):
                written += os.write(fd, line[written:])
        except OSError as exc:
            self._failed(exc, torn=0 < written < len(line))
            return False
        return True

    def _open(self) -> int:
        # Reopen when the file was removed or replaced (rotated), so lines go where the
        # daemon reads; one stat per line is cheap next to a training step.
        if self._fd is not None:
            try:
                same = os.stat(self.path).st_ino == os.fstat(self._fd).st_ino
            except OSError:
                same = False
            if not same:
                self.close()
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        return self._fd

    def _failed(self, exc: OSError, *, torn: bool) -> None:
        if torn and self._fd is not None:
            # End the torn line so the next one starts clean (the reader skips the torn one).
            with contextlib.suppress(OSError):
                os.write(self._fd, b"\n")
        self.close()
        self.dropped += 1
        if self._strict:
            raise exc
        if not self._warned:
            self._warned = True
            _log.warning("b300 progress: cannot write %s (%s); progress lines are dropped "
                         "until it works again", self.path, exc.strerror or exc)


def _path_field(path: str | os.PathLike[str] | None) -> str | None:
    """The checkpoint path for a line, or None when it cannot be one (too long, control
    characters): the event itself matters more than where it went."""
    if path is None:
        return None
    text = os.fspath(path)
    return text if 0 < len(text) <= MAX_PATH_CHARS and text.isprintable() else None
