"""Training job specs: TOML in, a validated frozen ``JobSpec`` out.

A spec looks like::

    name = "llama-405b"

    [job]
    command = "srun python train.py --resume {resume_from}"   # or: script = "train.sbatch"
    nodes = 2
    gpus_per_node = 8
    partition = "batch"
    time_limit = "2-00:00:00"

    [job.environment]
    NCCL_DEBUG = "WARN"

    [checkpoint]
    dir = "/lustre/ckpt/llama"
    layout = "dcp"
    interval = "1h"
    signal = "USR1"       # opt-in: the job checkpoints when it gets this signal
    signal_to = "batch"   # "batch": the batch shell only; "all": the shell, its children, every step

    [retries]
    infra = 5
    preemption = 20
    retryable_exit_codes = [134]

Every problem is reported as one :class:`SpecError` line naming the file and key.
These are the records; the grammar is :mod:`b300.spec.tables`, the text in and out
:mod:`b300.spec.text`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..training.thresholds import TrainingSpec

LAYOUTS = ("dcp", "megatron", "deepspeed", "hf", "lightning", "generic", "auto")
MAX_SCRIPT_BYTES = 1 << 20
RESERVED_ENV_PREFIXES = ("SLURM_", "B300_")  # the daemon sets these for the job


#: Signals a spec may ask for: ones a trainer can catch and that Slurm passes on.
#: KILL and STOP cannot be caught, so asking a job to checkpoint with them makes no sense.
CHECKPOINT_SIGNALS = ("USR1", "USR2", "URG", "HUP", "INT", "TERM", "ALRM", "WINCH", "CONT")
SIGNAL_TARGETS = ("batch", "all")


@dataclass(frozen=True, slots=True)
class CheckpointPolicy:
    """``signal`` is an opt-in: the job says it checkpoints when it gets that signal. Without
    it the daemon never signals the job (a shell that does not trap USR1 dies of it).
    ``signal_to`` is ``"batch"`` (``scancel --batch``: the batch shell only, like sbatch's
    ``--signal=B:...``) or ``"all"`` (``scancel --full``: the shell, its children and every step)."""

    dir: str | None = None
    layout: str = "generic"
    interval_s: float = 3600.0
    signal: str | None = None
    signal_to: str = "batch"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    infra: int = 3
    preemption: int = 10
    retryable_exit_codes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """Hang detection: the job writes its step to ``progress_file``; no new step
    for ``hang_timeout_s`` while it runs means it hangs. Before its first step
    an attempt has ``startup_timeout_s`` (loading data and a checkpoint, NCCL
    set-up), measured from its start."""

    progress_file: str | None = None
    hang_timeout_s: float = 1800.0
    startup_timeout_s: float = 3600.0
    #: The training-health keys of ``[health]`` (issue 17); None when the spec sets none of them.
    training: TrainingSpec | None = None


@dataclass(frozen=True, slots=True)
class ElasticPolicy:
    """A PyTorch Elastic launch (``[elastic]``, docs/elastic.md): one ``torchrun`` agent per
    node with ``--nnodes=min_nodes:max_nodes`` and a c10d rendezvous on ``port`` of the
    job's batch host. ``on_no_spare``: with no spare left after a node loss, ``"shrink"``
    (train on with the survivors while they are at least ``min_nodes``) or ``"resubmit"``
    (recovery resubmits from the newest verified checkpoint)."""

    min_nodes: int
    max_nodes: int
    max_restarts: int = 3
    port: int = 29400
    nproc_per_node: int = 1
    on_no_spare: str = "shrink"


ON_NO_SPARE = ("shrink", "resubmit")


@dataclass(frozen=True, slots=True)
class JobSpec:
    name: str
    command: str
    nodes: int
    gpus_per_node: int = 8
    ntasks_per_node: int | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str | None = None
    workdir: str | None = None
    output: str | None = None
    requeue: bool = False
    environment: tuple[tuple[str, str], ...] = ()
    #: Spare nodes inside the allocation (issue 15): the job asks for nodes + spare_nodes
    #: with ``--no-kill`` and b300.launcher runs ``command`` as a step on ``nodes`` of them.
    spare_nodes: int = 0
    #: PyTorch Elastic (issue 33): ``command`` is the training script and its arguments,
    #: run by torchrun on every node; None for an ordinary run.
    elastic: ElasticPolicy | None = None
    checkpoint: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    retries: RetryPolicy = field(default_factory=RetryPolicy)
    health: HealthPolicy = field(default_factory=HealthPolicy)
