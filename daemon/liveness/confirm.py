"""The confirmation check: an SSH round trip to each suspect node, through the drift runner.

Independent of the primary check: another daemon on the node (sshd, not slurmd),
another port, a fresh connection, the node's host key checked against our
known_hosts file (b300.drift.ssh.ParamikoRunner, RejectPolicy). A node that lets
us connect and authenticate is alive, whatever its slurmd does; one that refuses
the connection, cannot be reached or stays silent for the timeout is not.

Only suspect nodes are confirmed (a handful at a time), so its cost (measured:
~26 ms of CPU per node for connect + ``exec true``) does not scale with the cluster.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence

from ..drift.scan_records import Endpoint, NodeRun, NodeStatus, SshSettings
from ..drift.ssh import ParamikoRunner
from ..interfaces import NodeCommandRunner
from .timing import LivenessConfig
from .verdicts import ConfirmOutcome, ConfirmResult

#: The one command the confirmation runs: proves the node can start a process.
#: A node that authenticated us but did not finish it in time is still alive.
ALIVE_COMMAND = {"alive": "true"}


class SshConfirmer:
    """Confirms suspects with a :class:`b300.interfaces.NodeCommandRunner` (SSH)."""

    def __init__(self, runner: NodeCommandRunner, clock: Callable[[], float] = time.monotonic) -> None:
        self._runner = runner
        self._clock = clock

    def confirm(self, nodes: Sequence[str]) -> list[ConfirmResult]:
        """One result per node, never an exception (a runner that fails is NOT_CHECKED)."""
        if not nodes:
            return []
        start = self._clock()
        try:
            runs = self._runner.run(list(nodes), ALIVE_COMMAND)
        except Exception as exc:  # a broken runner must not read as "the nodes are dead"
            took = self._clock() - start
            return [ConfirmResult(n, ConfirmOutcome.NOT_CHECKED, took, f"confirmer failed: {exc}")
                    for n in nodes]
        took = self._clock() - start
        return [confirm_result(n, runs.get(n), took) for n in nodes]


def confirm_result(node: str, run: NodeRun | None, latency_s: float) -> ConfirmResult:
    """What one SSH run says about ``node`` being alive (pure)."""
    if run is None:
        return ConfirmResult(node, ConfirmOutcome.NOT_CHECKED, latency_s, "no answer from the runner")
    if run.status is NodeStatus.OK:
        finished = run.results.get("alive")
        how = "ssh: connected, authenticated" + (", ran true" if finished and finished.exit_code == 0
                                                  else ", command not finished")
        return ConfirmResult(node, ConfirmOutcome.ANSWERED, latency_s, how)
    if run.status in (NodeStatus.AUTH, NodeStatus.HOSTKEY):
        # Something at the node's address speaks SSH: not a dead node, but not proof it is ours.
        return ConfirmResult(node, ConfirmOutcome.ANSWERED_REFUSED, latency_s,
                             f"ssh {run.status.value}: {run.error}")
    if run.status is NodeStatus.UNREACHABLE and run.error == "no SSH address configured":
        return ConfirmResult(node, ConfirmOutcome.NOT_CHECKED, latency_s, run.error)
    return ConfirmResult(node, ConfirmOutcome.FAILED, latency_s, f"ssh {run.status.value}: {run.error}")


def confirm_runner(settings: SshSettings, addresses: Mapping[str, Endpoint],
                   config: LivenessConfig) -> ParamikoRunner:
    """A runner for confirmations: the drift SSH settings with the confirmation's short budget."""
    quick = dataclasses.replace(settings, connect_timeout_s=config.confirm_timeout_s,
                                command_timeout_s=config.confirm_timeout_s,
                                concurrency=min(settings.concurrency, 16))
    return ParamikoRunner(quick, addresses)
