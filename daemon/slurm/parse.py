"""Pure parsers for the output of Slurm's command-line tools.

Nothing here runs a command or reads a clock. The field lists are part of the
contract with :mod:`b300.slurm.cli`, which asks for exactly these fields, with
``|`` between them, free text last (so a ``|`` inside a reason cannot shift
the other columns). A line that cannot be parsed is skipped and reported to
the caller, never guessed at.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime

from ClusterShell.NodeSet import NodeSet, NodeSetException

from ..errors import SlurmError
from ..model import JobObservation, NodeObservation, SlurmState, is_node_name

# squeue -o: job id, state, node list, restart count is not offered by squeue,
# so it is not asked for; job name and reason last because they are free text.
SQUEUE_FORMAT = "%i|%T|%N|%S|%e|%j|%r"
SACCT_FIELDS = "JobIDRaw,State,ExitCode,NodeList,Start,End,JobName,Reason"
SINFO_FORMAT = "%N|%T|%E"

_JOB_ID_RE = re.compile(r"\d{1,12}")
# Phrases of Slurm (its tools' stderr, libslurm's error strings, pyslurm's own
# messages) that mean "try again later", not "refused".
_TRANSIENT = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Connection refused|"
    r"Slurm backup controller in standby|Zero Bytes were transmitted|"
    r"Unable to establish connection|slurmdbd: Connection|Problem talking to the database|"
    r"Transport endpoint is not connected|Resource temporarily unavailable|"
    r"Communication connection failure|Protocol authentication error|Munge|"
    r"Failed to (?:open \w+ to|get Jobs from) slurmdbd|Database connection is not open|"
    r"Unable to connect to database|timed out",
    re.IGNORECASE,
)
_EXIT_RE = re.compile(r"(\d{1,3}):(\d{1,3})")
_NO_NODES = {"", "None assigned", "(null)", "None", "n/a"}
_NO_TIME = {"", "Unknown", "None", "NONE", "N/A", "(null)", "0"}


def parse_sbatch(stdout: str) -> int:
    """The job id from ``sbatch --parsable`` output (``123`` or ``123;cluster``)."""
    for line in stdout.splitlines():
        head = line.strip().split(";", 1)[0]
        if _JOB_ID_RE.fullmatch(head):
            return int(head)
    raise SlurmError(f"sbatch printed no job id: {stdout.strip()[:200]!r}", transient=False)


def is_transient(message: str) -> bool:
    """Whether a Slurm error message means "unreachable or busy, try again"."""
    return bool(_TRANSIENT.search(message))


def check_node_name(node: str) -> str:
    """``node`` itself when it is a plain node name; SlurmError (not transient) otherwise."""
    if not is_node_name(node):
        raise SlurmError(f"bad node name {node!r}", transient=False)
    return node


def normalise_reason(reason: str) -> str:
    """A drain reason as Slurm keeps it: one line, short enough for ``sinfo -R``."""
    return " ".join(reason.split())[:200] or "b300"


def parse_state(raw: str) -> SlurmState:
    """``CANCELLED by 0`` -> CANCELLED; ``RUNNING`` -> RUNNING. Unknown raises ValueError."""
    word = raw.strip().split(" ", 1)[0].rstrip("+*").upper()
    return SlurmState(word)


def parse_exit_code(raw: str) -> tuple[int | None, int | None]:
    """sacct's ``EXIT:SIGNAL`` into two ints; anything else into (None, None)."""
    m = _EXIT_RE.fullmatch(raw.strip())
    if not m:
        return None, None
    return int(m.group(1)), int(m.group(2))


def parse_time(raw: str, tz: object = None) -> datetime | None:
    """A Slurm timestamp (``2026-11-29T19:00:00``, local time of the cluster) in UTC.

    ``tz`` is the cluster's time zone; ``None`` means this machine's local zone.
    """
    text = raw.strip()
    if text in _NO_TIME:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=tz) if tz is not None else value.astimezone()  # type: ignore[arg-type]
    return value.astimezone(UTC)


def expand_nodes(raw: str) -> tuple[str, ...]:
    """``gpu[01-03,07]`` -> ('gpu01', 'gpu02', 'gpu03', 'gpu07'); ``None assigned`` -> ()."""
    text = raw.strip()
    if text in _NO_NODES:
        return ()
    try:
        return tuple(NodeSet(text))
    except NodeSetException as exc:
        raise ValueError(f"bad node list {text!r}: {exc}") from None


def fold_nodes(nodes: Iterable[str]) -> str:
    """('gpu01', 'gpu02') -> 'gpu[01-02]': the form Slurm options accept."""
    return str(NodeSet.fromlist(list(nodes))) if nodes else ""


def parse_squeue(stdout: str) -> tuple[dict[int, JobObservation], list[str]]:
    """Lines of ``squeue -h -o SQUEUE_FORMAT`` into observations by job id.

    Array and heterogeneous job ids (``12_3``, ``12+0``) are skipped without
    complaint: the daemon never submits those.
    """
    out: dict[int, JobObservation] = {}
    bad: list[str] = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 6)
        if len(parts) != 7:
            bad.append(line)
            continue
        jid, state, nodes, start, end, name, reason = parts
        if not _JOB_ID_RE.fullmatch(jid.strip()):
            if not re.fullmatch(r"\d+[_+].*", jid.strip()):
                bad.append(line)
            continue
        try:
            obs = JobObservation(
                job_id=int(jid),
                state=parse_state(state),
                nodes=expand_nodes(nodes),
                start=parse_time(start),
                end=parse_time(end),
                name=name,
                reason=reason.strip() if reason.strip() != "None" else "",
                source="squeue",
            )
        except ValueError:
            bad.append(line)
            continue
        out[obs.job_id] = obs
    return out, bad


def parse_sacct(stdout: str) -> tuple[dict[int, JobObservation], list[str]]:
    """Lines of ``sacct -X -n -P --format=SACCT_FIELDS`` into observations.

    With ``-X`` there is one line per allocation; if a job id shows up more
    than once (requeued jobs with ``--duplicates``), the last line wins,
    which is the newest record of that id.
    """
    out: dict[int, JobObservation] = {}
    bad: list[str] = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 7)
        if len(parts) != 8:
            bad.append(line)
            continue
        jid, state, exit_code, nodes, start, end, name, reason = parts
        if not _JOB_ID_RE.fullmatch(jid.strip()):
            bad.append(line)
            continue
        code, sig = parse_exit_code(exit_code)
        try:
            obs = JobObservation(
                job_id=int(jid),
                state=parse_state(state),
                nodes=expand_nodes(nodes),
                start=parse_time(start),
                end=parse_time(end),
                name=name,
                reason=reason.strip() if reason.strip() != "None" else "",
                exit_code=code,
                signal=sig,
                source="sacct",
            )
        except ValueError:
            bad.append(line)
            continue
        out[obs.job_id] = obs
    return out, bad


def parse_sinfo(stdout: str) -> tuple[list[NodeObservation], list[str]]:
    """Lines of ``sinfo -h -N -o SINFO_FORMAT`` into one observation per node.

    A node in several partitions is listed once per partition; it is kept
    once. The state keeps sinfo's suffixes (``down*``: not responding;
    ``drain~``: powered off) as flags.
    """
    seen: dict[str, NodeObservation] = {}
    bad: list[str] = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 2)
        if len(parts) != 3:
            bad.append(line)
            continue
        name, state, reason = (p.strip() for p in parts)
        if not is_node_name(name) or not state:
            bad.append(line)
            continue
        flags = tuple(ch for ch in state if ch in "*~#!%$@^-")
        base = state.rstrip("*~#!%$@^-").upper()
        seen.setdefault(
            name,
            NodeObservation(name=name, state=base, reason="" if reason == "none" else reason,
                            flags=flags),
        )
    return [seen[n] for n in sorted(seen)], bad


def parse_default_partition(stdout: str) -> str | None:
    """The partition sinfo marks with ``*`` in ``sinfo -h -o %P`` (one name a line), or None."""
    for line in stdout.splitlines():
        name = line.strip()
        if name.endswith("*") and name.rstrip("*"):
            return name.rstrip("*")
    return None


def parse_partition_nodes(stdout: str, partition: str | None) -> list[str]:
    """Nodes of ``partition`` from ``sinfo -h -N -o %N|%P`` (``None``: the default
    partition, whose name sinfo marks with ``*``); sorted, each once."""
    found: set[str] = set()
    for line in stdout.splitlines():
        name, _, part = line.strip().partition("|")
        part = part.strip()
        if not name or not part:
            continue
        default = part.endswith("*")
        if (partition is None and default) or part.rstrip("*") == partition:
            found.add(name.strip())
    return sorted(found)
