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
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import SpecError
from .model import Run
from .validate import (
    get_bool,
    get_int,
    get_str,
    get_table,
    parse_duration,
    reject_unknown,
)

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SLURM_WORD_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or UNLIMITED.
TIME_LIMIT_RE = re.compile(r"\d{1,6}|\d{1,6}:\d{1,2}(:\d{1,2})?|\d{1,4}-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED")
ABS_PATH_RE = re.compile(r"/[^\x00\n]*")
LAYOUTS = ("dcp", "megatron", "deepspeed", "hf", "lightning", "generic", "auto")
MAX_SCRIPT_BYTES = 1 << 20
_RESERVED_ENV_PREFIXES = ("SLURM_", "B300_")


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
    checkpoint: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    retries: RetryPolicy = field(default_factory=RetryPolicy)
    health: HealthPolicy = field(default_factory=HealthPolicy)


def load_spec_file(path: str | Path) -> tuple[JobSpec, str]:
    """Read and validate a spec file; return the spec and the TOML text to store.

    A ``script = FILE`` is read now (relative to the spec's folder) and
    inlined into the stored text as ``command``, so that a run can always
    be resubmitted exactly as it was first submitted.
    """
    p = Path(path)
    where = str(p)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise SpecError(f"{where}: cannot read spec: {exc.strerror or exc}") from None
    except ValueError:  # a NUL byte in the path
        raise SpecError(f"{where!r}: not a valid path") from None
    if len(raw) > MAX_SCRIPT_BYTES:
        raise SpecError(f"{where}: spec is larger than {MAX_SCRIPT_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"{where}: spec is not UTF-8 text") from None
    spec = parse_spec(text, where=where, base_dir=p.parent)
    return spec, dump_spec(spec)


def parse_spec(text: str, *, where: str = "spec", base_dir: Path | None = None) -> JobSpec:
    """Validate spec TOML text. ``base_dir`` resolves a relative ``script``."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{where}: not valid TOML: {exc}") from None
    reject_unknown(doc, {"name", "job", "checkpoint", "retries", "health"}, where, SpecError)
    name = get_str(doc, "name", where, SpecError, pattern=NAME_RE,
                   what="a valid name (letters, digits, '.', '_', '-'; at most 64)")
    if name is None:
        raise SpecError(f"{where}: name is missing")
    job = get_table(doc, "job", where, SpecError)
    if not job:
        raise SpecError(f"{where}: [job] table is missing")
    jw = f"{where}: [job]"
    reject_unknown(
        job,
        {"command", "script", "nodes", "gpus_per_node", "ntasks_per_node", "partition",
         "account", "qos", "time_limit", "workdir", "output", "requeue", "environment"},
        jw, SpecError,
    )
    command = _command(job, jw, base_dir)
    nodes = get_int(job, "nodes", jw, SpecError, lo=1, hi=100_000)
    if nodes is None:
        raise SpecError(f"{jw}: nodes is missing")
    return JobSpec(
        name=name,
        command=command,
        nodes=nodes,
        gpus_per_node=get_int(job, "gpus_per_node", jw, SpecError, default=8, lo=0, hi=64) or 0,
        ntasks_per_node=get_int(job, "ntasks_per_node", jw, SpecError, lo=1, hi=1024),
        partition=get_str(job, "partition", jw, SpecError, pattern=SLURM_WORD_RE,
                          what="a Slurm partition name"),
        account=get_str(job, "account", jw, SpecError, pattern=SLURM_WORD_RE,
                        what="a Slurm account name"),
        qos=get_str(job, "qos", jw, SpecError, pattern=SLURM_WORD_RE, what="a Slurm QOS name"),
        time_limit=get_str(job, "time_limit", jw, SpecError, pattern=TIME_LIMIT_RE,
                           what="a Slurm time limit like '04:00:00' or '2-00:00:00'"),
        workdir=get_str(job, "workdir", jw, SpecError, pattern=ABS_PATH_RE,
                        what="an absolute path"),
        output=get_str(job, "output", jw, SpecError, pattern=ABS_PATH_RE,
                       what="an absolute path"),
        requeue=get_bool(job, "requeue", jw, SpecError, default=False),
        environment=_environment(job, jw),
        checkpoint=_checkpoint(get_table(doc, "checkpoint", where, SpecError), where),
        retries=_retries(get_table(doc, "retries", where, SpecError), where),
        health=_health(get_table(doc, "health", where, SpecError), where),
    )


def _health(table: Mapping[str, Any], where: str) -> HealthPolicy:
    hw = f"{where}: [health]"
    reject_unknown(table, {"progress_file", "hang_timeout", "startup_timeout"}, hw, SpecError)
    return HealthPolicy(
        progress_file=get_str(table, "progress_file", hw, SpecError, pattern=ABS_PATH_RE,
                              what="an absolute path"),
        hang_timeout_s=parse_duration(table.get("hang_timeout", 1800), "hang_timeout", hw,
                                      SpecError),
        startup_timeout_s=parse_duration(table.get("startup_timeout", 3600), "startup_timeout",
                                         hw, SpecError),
    )


def _command(job: Mapping[str, Any], where: str, base_dir: Path | None) -> str:
    command = get_str(job, "command", where, SpecError)
    script = get_str(job, "script", where, SpecError)
    if (command is None) == (script is None):
        raise SpecError(f"{where}: give exactly one of command or script")
    if script is not None:
        path = Path(script)
        if not path.is_absolute():
            if base_dir is None:
                raise SpecError(f"{where}: script {script!r} must be an absolute path here")
            path = base_dir / path
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise SpecError(f"{where}: cannot read script {script!r}: {exc.strerror or exc}") from None
        if len(data) > MAX_SCRIPT_BYTES:
            raise SpecError(f"{where}: script {script!r} is larger than {MAX_SCRIPT_BYTES} bytes")
        try:
            command = data.decode("utf-8")
        except UnicodeDecodeError:
            raise SpecError(f"{where}: script {script!r} is not UTF-8 text") from None
    assert command is not None
    if not command.strip():
        raise SpecError(f"{where}: command is empty")
    return command


def _environment(job: Mapping[str, Any], where: str) -> tuple[tuple[str, str], ...]:
    env = job.get("environment", {})
    if not isinstance(env, Mapping):
        raise SpecError(f"{where}: environment must be a table of strings")
    out = []
    for key, value in env.items():
        if not ENV_KEY_RE.fullmatch(key):
            raise SpecError(f"{where}: environment key {key!r} is not a valid variable name")
        if key.startswith(_RESERVED_ENV_PREFIXES):
            raise SpecError(f"{where}: environment key {key!r} uses a reserved prefix")
        if not isinstance(value, str) or "\x00" in value:
            raise SpecError(f"{where}: environment value of {key} must be a string")
        out.append((key, value))
    return tuple(sorted(out))


def _checkpoint(table: Mapping[str, Any], where: str) -> CheckpointPolicy:
    cw = f"{where}: [checkpoint]"
    reject_unknown(table, {"dir", "layout", "interval", "signal", "signal_to"}, cw, SpecError)
    layout = get_str(table, "layout", cw, SpecError, default="generic")
    if layout not in LAYOUTS:
        raise SpecError(f"{cw}: layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    interval = parse_duration(table.get("interval", 3600), "interval", cw, SpecError)
    signal = get_str(table, "signal", cw, SpecError)
    if signal is not None:
        signal = signal.upper().removeprefix("SIG")
        if signal not in CHECKPOINT_SIGNALS:
            raise SpecError(f"{cw}: signal must be one the job can trap: {', '.join(CHECKPOINT_SIGNALS)}"
                            f" (got {signal[:20]!r})")
    signal_to = get_str(table, "signal_to", cw, SpecError, default="batch")
    if signal_to not in SIGNAL_TARGETS:
        raise SpecError(f"{cw}: signal_to must be \"batch\" or \"all\" (got {str(signal_to)[:20]!r})")
    if "signal_to" in table and signal is None:
        raise SpecError(f"{cw}: signal_to needs signal (the signal the job checkpoints on)")
    dir_ = get_str(table, "dir", cw, SpecError, pattern=ABS_PATH_RE, what="an absolute path")
    if signal is not None and dir_ is None:
        raise SpecError(f"{cw}: signal needs dir (the daemon signals only when the checkpoints there are late)")
    return CheckpointPolicy(dir=dir_, layout=layout, interval_s=interval, signal=signal,
                            signal_to=signal_to or "batch")


def _retries(table: Mapping[str, Any], where: str) -> RetryPolicy:
    rw = f"{where}: [retries]"
    reject_unknown(table, {"infra", "preemption", "retryable_exit_codes"}, rw, SpecError)
    codes = table.get("retryable_exit_codes", [])
    if not isinstance(codes, list) or not all(
        isinstance(c, int) and not isinstance(c, bool) and 1 <= c <= 255 for c in codes
    ):
        raise SpecError(f"{rw}: retryable_exit_codes must be a list of integers 1-255")
    return RetryPolicy(
        infra=get_int(table, "infra", rw, SpecError, default=3, lo=0, hi=1000) or 0,
        preemption=get_int(table, "preemption", rw, SpecError, default=10, lo=0, hi=10000) or 0,
        retryable_exit_codes=tuple(sorted(set(codes))),
    )


def dump_spec(spec: JobSpec) -> str:
    """Canonical TOML for a spec; ``parse_spec(dump_spec(s)) == s``."""
    lines = [f"name = {_toml_str(spec.name)}", "", "[job]", f"command = {_toml_str(spec.command)}",
             f"nodes = {spec.nodes}", f"gpus_per_node = {spec.gpus_per_node}"]
    for key in ("ntasks_per_node", "partition", "account", "qos", "time_limit", "workdir", "output"):
        value = getattr(spec, key)
        if value is not None:
            lines.append(f"{key} = {value if isinstance(value, int) else _toml_str(value)}")
    lines.append(f"requeue = {'true' if spec.requeue else 'false'}")
    if spec.environment:
        lines += ["", "[job.environment]"]
        lines += [f"{k} = {_toml_str(v)}" for k, v in spec.environment]
    lines += ["", "[checkpoint]", f"layout = {_toml_str(spec.checkpoint.layout)}",
              f"interval = {spec.checkpoint.interval_s!r}"]
    if spec.checkpoint.dir is not None:
        lines.append(f"dir = {_toml_str(spec.checkpoint.dir)}")
    if spec.checkpoint.signal is not None:
        lines += [f"signal = {_toml_str(spec.checkpoint.signal)}",
                  f"signal_to = {_toml_str(spec.checkpoint.signal_to)}"]
    lines += ["", "[retries]", f"infra = {spec.retries.infra}",
              f"preemption = {spec.retries.preemption}",
              f"retryable_exit_codes = [{', '.join(map(str, spec.retries.retryable_exit_codes))}]",
              "", "[health]", f"hang_timeout = {spec.health.hang_timeout_s!r}",
              f"startup_timeout = {spec.health.startup_timeout_s!r}"]
    if spec.health.progress_file is not None:
        lines.append(f"progress_file = {_toml_str(spec.health.progress_file)}")
    return "\n".join(lines) + "\n"


def _toml_str(value: str) -> str:
    # A basic TOML string with every control character escaped: round-trips any text.
    out = ['"']
    for ch in value:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def spec_of(run: Run) -> JobSpec:
    """The run's spec, parsed from the text stored with it (a SpecError names the run)."""
    return parse_spec(run.spec_toml, where=f"run {run.id}")
