"""The Slurm client that drives Slurm's own command-line tools.

Every call runs one tool with an argv list (never a shell), a timeout and a
fixed environment, and hands its output to the pure parsers in
:mod:`b300.slurm.parse`. Names from users or Slurm only ever travel as
single argv elements.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path

import structlog

from ..errors import SlurmError
from ..model import JobObservation, NodeAddress, NodeObservation, SubmitRequest
from .parse import (
    SACCT_FIELDS,
    SINFO_FORMAT,
    SQUEUE_FORMAT,
    check_node_name,
    fold_nodes,
    is_transient,
    normalise_reason,
    parse_default_partition,
    parse_partition_nodes,
    parse_sacct,
    parse_sbatch,
    parse_sinfo,
    parse_squeue,
)

log = structlog.get_logger(__name__)

# Job ids per command line: 5,000 ids of up to 12 digits stay far below ARG_MAX's
# 128 KiB per-argument cap.
_MAX_IDS_PER_CALL = 5000

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


class CliSlurmClient:
    """:class:`b300.interfaces.SlurmClient` over sbatch/squeue/sacct/sinfo/scontrol/scancel.

    ``slurm_conf`` sets ``SLURM_CONF`` for the tools; ``bin_dir`` is where
    they are (default: ``PATH``). ``calls`` counts tool runs by name, which
    the benchmarks read to report Slurm calls per poll cycle.
    """

    name = "cli"

    def __init__(
        self,
        *,
        slurm_conf: str | None = None,
        bin_dir: str | None = None,
        timeout: float = 30.0,
        runner: Runner = subprocess.run,
        env: Mapping[str, str] | None = None,
    ) -> None:
        base = dict(os.environ if env is None else env)
        if slurm_conf:
            base["SLURM_CONF"] = slurm_conf
        # sbatch exports its environment into the job: the job gets the daemon's
        # own, not the settings below, which are only for reading the tools' output.
        self._job_env = dict(base)
        # Slurm tools print times in this format when told; keep it fixed.
        base["SLURM_TIME_FORMAT"] = "standard"
        base.setdefault("LC_ALL", "C")
        self._env = base
        self._bin_dir = bin_dir
        self._timeout = timeout
        self._run = runner
        self.calls: dict[str, int] = {}

    # -- plumbing ---------------------------------------------------------

    def _tool(self, name: str) -> str:
        return str(Path(self._bin_dir) / name) if self._bin_dir else name

    def _call(self, argv: Sequence[str], *, stdin: str | None = None, ok_codes: tuple[int, ...] = (0,),
              env: Mapping[str, str] | None = None) -> str:
        tool = argv[0]
        self.calls[tool] = self.calls.get(tool, 0) + 1
        try:
            proc = self._run(
                [self._tool(tool), *argv[1:]],
                input=stdin,
                capture_output=True,
                text=True,
                timeout=self._timeout,
                env=self._env if env is None else env,
                check=False,
                stdin=None if stdin is not None else subprocess.DEVNULL,
            )
        except FileNotFoundError:
            raise SlurmError(f"{tool} not found (is Slurm installed and on PATH?)", transient=False) from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{tool} timed out after {self._timeout:.0f} s", transient=True) from None
        except OSError as exc:
            # E2BIG (argument list too long) will not get better by retrying.
            raise SlurmError(f"{tool} could not run: {exc}",
                             transient=exc.errno != errno.E2BIG) from None
        if proc.returncode not in ok_codes:
            err = " ".join((proc.stderr or proc.stdout or "").split())[:300]
            raise SlurmError(
                f"{tool} failed (exit {proc.returncode}): {err or 'no message'}",
                transient=is_transient(err) or proc.returncode < 0,
            )
        return proc.stdout

    # -- SlurmClient ------------------------------------------------------

    def submit(self, request: SubmitRequest) -> int:
        # The script comes on stdin: nothing is written to a shared folder.
        return parse_sbatch(self._call(sbatch_argv(request), stdin=request.script, env=self._job_env))

    def jobs(self, job_ids: Sequence[int]) -> dict[int, JobObservation]:
        if not job_ids:
            return {}
        wanted = set(job_ids)
        argv = ["squeue", "--noheader", "--states=all", f"--format={SQUEUE_FORMAT}"]
        # With more than one id squeue loads the whole job table anyway (one RPC);
        # past a few thousand ids, leave them off so the argv stays small.
        if len(wanted) <= _MAX_IDS_PER_CALL:
            argv.append(f"--jobs={','.join(str(int(j)) for j in sorted(wanted))}")
        try:
            out = self._call(argv)
        except SlurmError as exc:
            # squeue refuses a list whose every id has left the controller.
            if "Invalid job id" in str(exc):
                return {}
            raise
        records, bad = parse_squeue(out)
        if bad:
            log.warning("slurm.unparsed_lines", tool="squeue", count=len(bad), first=bad[0][:200])
        return {j: o for j, o in records.items() if j in wanted}

    def accounting(self, job_ids: Sequence[int]) -> dict[int, JobObservation]:
        ids = sorted({int(j) for j in job_ids})
        records: dict[int, JobObservation] = {}
        # sacct filters in slurmdbd, so ids must be named: chunks keep argv bounded.
        for i in range(0, len(ids), _MAX_IDS_PER_CALL):
            chunk = ",".join(map(str, ids[i:i + _MAX_IDS_PER_CALL]))
            out = self._call(["sacct", "--allocations", "--noheader", "--parsable2",
                              f"--jobs={chunk}", f"--format={SACCT_FIELDS}"])
            found, bad = parse_sacct(out)
            if bad:
                log.warning("slurm.unparsed_lines", tool="sacct", count=len(bad),
                            first=bad[0][:200])
            records.update(found)
        return records

    def find_by_name(self, job_name: str, since: datetime | None = None) -> list[JobObservation]:
        found: dict[int, JobObservation] = {}
        out = self._call(["squeue", "--noheader", "--states=all", f"--name={job_name}",
                          f"--format={SQUEUE_FORMAT}"])
        found.update(parse_squeue(out)[0])
        start = since.astimezone().strftime("%Y-%m-%dT%H:%M:%S") if since else "2000-01-01T00:00:00"
        out = self._call(["sacct", "--allocations", "--noheader", "--parsable2",
                          f"--name={job_name}", f"--starttime={start}", f"--format={SACCT_FIELDS}"])
        for jid, obs in parse_sacct(out)[0].items():
            found.setdefault(jid, obs)
        return [o for o in sorted(found.values(), key=lambda o: o.job_id) if o.name == job_name]

    def cancel(self, job_id: int, *, signal: str | None = None, batch_only: bool = False,
               full: bool = False) -> None:
        argv = ["scancel"]
        if signal:
            if not re.fullmatch(r"[A-Z0-9]{1,10}", signal):
                raise SlurmError(f"bad signal name {signal!r}", transient=False)
            argv.append(f"--signal={signal}")
        if batch_only:
            argv.append("--batch")
        elif full:
            argv.append("--full")
        argv.append(str(int(job_id)))
        self._call(argv)

    def version(self) -> str:
        """What ``sinfo -V`` prints (``slurm-wlm 24.11.5``); see :mod:`b300.slurm.release`."""
        return self._call(["sinfo", "-V"]).strip()

    def call_counts(self) -> dict[str, int]:
        return dict(self.calls)

    def close(self) -> None:
        """Nothing to release: every request is its own process."""

    def nodes(self) -> list[NodeObservation]:
        out = self._call(["sinfo", "--noheader", "--Node", f"--format={SINFO_FORMAT}"])
        nodes, bad = parse_sinfo(out)
        if bad:
            log.warning("slurm.unparsed_lines", tool="sinfo", count=len(bad), first=bad[0][:200])
        return nodes

    def partition_nodes(self, partition: str | None) -> list[str]:
        argv = ["sinfo", "--noheader", "--Node", "--format=%N|%P"]
        if partition is not None:
            argv.append(f"--partition={_word(partition)}")
        return parse_partition_nodes(self._call(argv), partition)

    def default_partition(self) -> str | None:
        return parse_default_partition(self._call(["sinfo", "--noheader", "--format=%P"]))

    def node_addresses(self, nodes: Sequence[str]) -> dict[str, NodeAddress]:
        from ..liveness.slurm_addr import parse_node_addresses, parse_slurmd_port, with_default_port

        names = [check_node_name(n) for n in nodes]
        if not names:
            return {}
        # -o: one record a line; a hostlist keeps argv short for thousands of nodes.
        wanted = set(names)
        found = parse_node_addresses(self._call(["scontrol", "show", "node", "-o", fold_nodes(names)]))
        found = {n: a for n, a in found.items() if n in wanted}
        if any(a.port is None for a in found.values()):
            # Slurm prints no Port= for a node on the cluster's SlurmdPort: ask for that one.
            port = parse_slurmd_port(self._call(["scontrol", "show", "config"]))
            if port is not None:
                found = with_default_port(found, port)
        return found

    def drain_node(self, node: str, reason: str) -> None:
        self._call(["scontrol", "update", f"NodeName={check_node_name(node)}", "State=DRAIN",
                    f"Reason={normalise_reason(reason)}"])

    def down_node(self, node: str, reason: str) -> None:
        self._call(["scontrol", "update", f"NodeName={check_node_name(node)}", "State=DOWN",
                    f"Reason={normalise_reason(reason)}"])

    def resume_node(self, node: str) -> None:
        self._call(["scontrol", "update", f"NodeName={check_node_name(node)}", "State=RESUME"])

    def reboot_node(self, node: str, reason: str) -> None:
        """ASAP: drained until idle, then rebooted by slurm.conf's RebootProgram; nextstate=DOWN:
        it takes no job after the reboot until it is resumed (ASAP alone would clear the drain)."""
        self._call(["scontrol", "reboot", "ASAP", "nextstate=DOWN", f"reason={normalise_reason(reason)}",
                    check_node_name(node)])

    def exclude_nodes(self, job_id: int, nodes: Sequence[str]) -> None:
        names = [check_node_name(n) for n in nodes]
        self._call(["scontrol", "update", f"JobId={int(job_id)}",
                    f"ExcNodeList={fold_nodes(names)}"])

    # -- the daemon's spare pools (b300.spares): its own reservations ------

    def reservation_list(self) -> str:
        """What ``scontrol show reservation -o`` prints (b300.spares.pool parses it)."""
        return self._call(["scontrol", "show", "reservation", "-o"])

    def create_reservation(self, name: str, nodes: Sequence[str], *, users: str,
                           partition: str) -> None:
        """A reservation of ``nodes`` from now on, with no end (Duration=infinite), that only
        ``users`` may run in, and only jobs that name it. One flag, NO_HOLD_JOBS_AFTER_END:
        a job still pending in it when it is deleted goes to the queue (without it Slurm
        holds the job, priority 0, reason ReservationDeleted). No other: not MAINT (its
        nodes would count as maintenance in accounting, and it may overlap other
        reservations), never IGNORE_JOBS (Slurm then refuses nodes a job uses, a second
        guard), no REPLACE (the daemon picks the nodes itself: drift-clean ones)."""
        names = [check_node_name(n) for n in nodes]
        self._call(["scontrol", "create", "reservation", f"ReservationName={_resv(name)}",
                    f"Users={_user(users)}", f"PartitionName={_word(partition)}",
                    f"Nodes={fold_nodes(names)}", "StartTime=now", "Duration=infinite",
                    "Flags=NO_HOLD_JOBS_AFTER_END"])

    def add_reservation_flag(self, name: str, flag: str) -> None:
        """Add one flag to a reservation (an adopted pool made without NO_HOLD_JOBS_AFTER_END)."""
        self._call(["scontrol", "update", f"ReservationName={_resv(name)}", f"Flags+={_word(flag)}"])

    def update_reservation(self, name: str, nodes: Sequence[str]) -> None:
        names = [check_node_name(n) for n in nodes]
        self._call(["scontrol", "update", f"ReservationName={_resv(name)}",
                    f"Nodes={fold_nodes(names)}"])

    def delete_reservation(self, name: str) -> None:
        self._call(["scontrol", "delete", f"ReservationName={_resv(name)}"])

    def ensure_node_down_trigger(self, program: str) -> bool:
        if not re.fullmatch(r"/[A-Za-z0-9._/-]{1,200}", program):
            raise SlurmError(f"bad trigger program path {program!r}", transient=False)
        try:
            existing = self._call(["strigger", "--get", "--node", "--down"], ok_codes=(0, 1))
        except SlurmError as exc:
            if exc.transient:
                raise
            return False
        if program in existing:
            return True
        try:
            self._call(["strigger", "--set", "--node", "--down", "--flags=PERM",
                        f"--program={program}"])
        except SlurmError as exc:
            if exc.transient:
                raise
            log.warning("slurm.trigger_refused", error=str(exc))
            return False
        return True

    def remove_node_down_trigger(self, program: str) -> int:
        """Clear every trigger whose program is ``program`` (a PERM trigger outlives
        the daemon; ``deploy/install.sh --uninstall`` calls this). The number cleared."""
        out = self._call(["strigger", "--get"], ok_codes=(0, 1))
        ids = [fields[0] for line in out.splitlines()
               if (fields := line.split()) and fields[0].isdigit() and fields[-1] == program]
        for trig_id in ids:
            self._call(["strigger", "--clear", f"--id={trig_id}"])
        return len(ids)


def sbatch_argv(request: SubmitRequest) -> list[str]:
    """The sbatch command line of ``request`` (its script goes on stdin; pure)."""
    argv = ["sbatch", "--parsable", f"--job-name={request.job_name}",
            f"--comment={request.comment}", f"--nodes={request.nodes}"]
    if request.ntasks_per_node:
        argv.append(f"--ntasks-per-node={request.ntasks_per_node}")
    if request.gpus_per_node:
        argv.append(f"--gpus-per-node={request.gpus_per_node}")
    for opt, value in (("--partition", request.partition), ("--time", request.time_limit),
                       ("--account", request.account), ("--qos", request.qos),
                       ("--output", request.output), ("--chdir", request.workdir)):
        if value:
            argv.append(f"{opt}={value}")
    if request.excluded_nodes:
        argv.append(f"--exclude={fold_nodes(request.excluded_nodes)}")
    argv.append("--requeue" if request.requeue else "--no-requeue")
    if request.no_kill:
        argv.append("--no-kill")
    if request.reservation:
        argv.append(f"--reservation={_resv(request.reservation)}")
    return argv


def _resv(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}", name):
        raise SlurmError(f"bad reservation name {name!r}", transient=False)
    return name


def _user(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}", name):
        raise SlurmError(f"bad user name {name!r}", transient=False)
    return name


def _word(word: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", word):
        raise SlurmError(f"bad partition name {word!r}", transient=False)
    return word
