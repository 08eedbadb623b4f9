"""Spec text in and out: a file or TOML text to a validated :class:`JobSpec`, and back."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SpecError
from ..model import Run
from .jobspec import MAX_SCRIPT_BYTES, CheckpointPolicy, ElasticPolicy, HealthPolicy, JobSpec, RetryPolicy

if TYPE_CHECKING:
    from ..training.thresholds import TrainingSpec
    from .tables import HealthTable, SpecFile


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
    """Validate spec TOML text (rules: :mod:`b300.spec.tables`); every problem is one
    SpecError line naming ``where``, the table and the key. ``base_dir`` resolves a
    relative ``script``."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{where}: not valid TOML: {exc}") from None
    # The models are built when first needed (pydantic, tens of ms), not with b300.spec.
    from ..grammar.types import validate
    from .tables import SpecFile

    f = validate(SpecFile, doc, where, SpecError)
    job, ckpt, retries, health = f.job, f.checkpoint, f.retries, f.health
    command = job.command if job.script is None else _read_script(job.script, f"{where}: [job]", base_dir)
    if job.spare_nodes and _runs_srun(command or ""):
        what = "command" if job.script is None else f"script {job.script!r}"
        raise SpecError(f"{where}: [job] {what}: with spare_nodes it is what each task runs "
                        "and b300's launcher starts it with srun; remove the srun")
    elastic = _elastic(f, command or "", where)
    return JobSpec(
        name=f.name,
        command=command or "",
        nodes=job.nodes,
        gpus_per_node=job.gpus_per_node,
        ntasks_per_node=job.ntasks_per_node,
        partition=job.partition,
        account=job.account,
        qos=job.qos,
        time_limit=job.time_limit,
        workdir=job.workdir,
        output=job.output,
        requeue=job.requeue,
        spare_nodes=job.spare_nodes,
        elastic=elastic,
        environment=tuple(sorted(job.environment.items())),
        checkpoint=CheckpointPolicy(dir=ckpt.dir, layout=ckpt.layout, interval_s=ckpt.interval,
                                    signal=ckpt.signal, signal_to=ckpt.signal_to),
        retries=RetryPolicy(infra=retries.infra, preemption=retries.preemption,
                            retryable_exit_codes=tuple(sorted(set(retries.retryable_exit_codes)))),
        health=HealthPolicy(progress_file=health.progress_file, hang_timeout_s=health.hang_timeout,
                            startup_timeout_s=health.startup_timeout, training=_training_spec(health)),
    )


def _elastic(f: SpecFile, command: str, where: str) -> ElasticPolicy | None:
    """``[elastic]`` checked against ``[job]``: the command is the training script and its
    arguments (torchrun runs it; one line, split as a shell would, never run by a shell)."""
    e = f.elastic
    if e is None:
        return None
    job = f.job
    if not e.min_nodes <= job.nodes <= e.max_nodes:
        raise SpecError(f"{where}: [job] nodes ({job.nodes}) must be within [elastic] min_nodes "
                        f"and max_nodes ({e.min_nodes}..{e.max_nodes})")
    if job.ntasks_per_node not in (None, 1):
        raise SpecError(f"{where}: [job] ntasks_per_node: an elastic run has one torchrun agent per "
                        "node; give [elastic] nproc_per_node for the workers instead")
    words = _elastic_words(command)
    if isinstance(words, str):
        raise SpecError(f"{where}: [job] command: {words}")
    return ElasticPolicy(min_nodes=e.min_nodes, max_nodes=e.max_nodes, max_restarts=e.max_restarts,
                         port=e.port, nproc_per_node=e.nproc_per_node, on_no_spare=e.on_no_spare)


def _elastic_words(command: str) -> list[str] | str:
    """The words of an elastic run's command, or what is wrong with it."""
    import shlex

    if "\n" in command.strip():
        return "with [elastic] it is one line: the training script and its arguments"
    try:
        words = shlex.split(command)
    except ValueError as exc:
        return f"cannot be split into words: {exc}"
    if not words:
        return "is empty"
    first = words[0].rsplit("/", 1)[-1]
    if first in ("srun", "torchrun") or words[:3] == ["python", "-m", "torch.distributed.run"]:
        return (f"with [elastic] it is the training script and its arguments; b300 starts "
                f"torchrun with srun (remove {first})")
    return words


def elastic_argv(spec: JobSpec) -> list[str]:
    """The training script and its arguments of an elastic run (what torchrun runs)."""
    words = _elastic_words(spec.command)
    if isinstance(words, str):
        raise SpecError(f"run {spec.name}: [job] command: {words}")
    return words


_TRAINING_KEYS = ("megatron_log", "model_params", "tokens_per_sample", "no_restart_exit_codes", "signals")


def _training_spec(health: HealthTable) -> TrainingSpec | None:
    """The issue-17 keys of ``[health]`` as a :class:`TrainingSpec`; None if none is set."""
    given = health.model_fields_set & set(_TRAINING_KEYS)
    if not given:
        return None
    from ..training.thresholds import TrainingSpec

    data = {k: getattr(health, k) for k in given if getattr(health, k) is not None}
    if "no_restart_exit_codes" in data:
        data["no_restart_exit_codes"] = tuple(data["no_restart_exit_codes"])
    return TrainingSpec.model_validate(data)


def _runs_srun(command: str) -> bool:
    """A line of ``command`` starts with srun (a step inside the launcher's step)."""
    for line in command.splitlines():
        words = line.split()
        if words and not words[0].startswith("#") and words[0].rsplit("/", 1)[-1] == "srun":
            return True
    return False


def spec_of(run: Run) -> JobSpec:
    """The run's spec, parsed from the text stored with it (a SpecError names the run)."""
    return parse_spec(run.spec_toml, where=f"run {run.id}")


def _read_script(script: str, where: str, base_dir: Path | None) -> str:
    path = Path(script)
    if not path.is_absolute():
        if base_dir is None:
            raise SpecError(f"{where} script {script!r} must be an absolute path here "
                            "(no spec folder to start from)")
        path = base_dir / path
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SpecError(f"{where} script {script!r} cannot be read: {exc.strerror or exc}") from None
    if len(data) > MAX_SCRIPT_BYTES:
        raise SpecError(f"{where} script {script!r} is larger than {MAX_SCRIPT_BYTES} bytes")
    try:
        command = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"{where} script {script!r} is not UTF-8 text") from None
    if not command.strip():
        raise SpecError(f"{where} script {script!r} is empty")
    return command


def dump_spec(spec: JobSpec) -> str:
    """Canonical TOML for a spec; ``parse_spec(dump_spec(s)) == s``."""
    lines = [f"name = {_toml_str(spec.name)}", "", "[job]", f"command = {_toml_str(spec.command)}",
             f"nodes = {spec.nodes}", f"gpus_per_node = {spec.gpus_per_node}"]
    for key in ("ntasks_per_node", "partition", "account", "qos", "time_limit", "workdir", "output"):
        value = getattr(spec, key)
        if value is not None:
            lines.append(f"{key} = {value if isinstance(value, int) else _toml_str(value)}")
    lines.append(f"requeue = {'true' if spec.requeue else 'false'}")
    if spec.spare_nodes:
        lines.append(f"spare_nodes = {spec.spare_nodes}")
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
    if spec.health.training is not None:
        lines += _dump_training(spec.health.training)
    if spec.elastic is not None:
        e = spec.elastic
        lines += ["", "[elastic]", f"min_nodes = {e.min_nodes}", f"max_nodes = {e.max_nodes}",
                  f"max_restarts = {e.max_restarts}", f"port = {e.port}",
                  f"nproc_per_node = {e.nproc_per_node}", f"on_no_spare = {_toml_str(e.on_no_spare)}"]
    return "\n".join(lines) + "\n"


def _dump_training(t: TrainingSpec) -> list[str]:
    """The issue-17 keys of ``[health]`` (only those set), then ``[health.signals.*]``."""
    lines = []
    for key in ("megatron_log", "model_params", "tokens_per_sample", "no_restart_exit_codes"):
        if key in t.model_fields_set:
            lines.append(f"{key} = {_toml_value(getattr(t, key))}")
    for name in type(t.signals).model_fields:
        table = getattr(t.signals, name)
        if table is None:
            continue
        lines += ["", f"[health.signals.{name}]"]
        lines += [f"{k} = {_toml_value(getattr(table, k))}" for k in sorted(table.model_fields_set)]
    return lines


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return _toml_str(value)
    return "[" + ", ".join(_toml_value(v) for v in value) + "]"


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
