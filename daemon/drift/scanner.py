"""The drift scan: probe nodes over SSH, judge them, drain and resume, record it all.

:meth:`DriftScanner.collect` does the SSH part (slow, touches no state) and
:meth:`DriftScanner.apply` the rest, so the daemon can hold its action lock
only for the second. :meth:`DriftScanner.scan` is both.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from ..cycle.node_actions import NodeActions
from ..errors import SlurmError, UsageError
from ..interfaces import DriftProbe, DriftRepository, NodeCommandRunner, SlurmClient, Store
from ..plugin_registry import PluginRegistry
from .baseline import find_differences, node_report, plan_actions, released
from .scan_records import (
    DriftConfig,
    Finding,
    NodeReport,
    NodeRun,
    NodeStatus,
    Policy,
    ProbeStatus,
    ProbeValue,
    ScanResult,
)

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Collected:
    """What SSH brought back from one scan's nodes."""

    nodes: tuple[str, ...]
    runs: Mapping[str, NodeRun]
    wall_s: float


class DriftScanner:
    """Scans the nodes of a :class:`DriftConfig` with the given probes and runner."""

    def __init__(
        self,
        config: DriftConfig,
        store: DriftRepository,
        slurm: SlurmClient,
        *,
        probes: Mapping[str, DriftProbe],
        runner: NodeCommandRunner,
        actor: str = "daemon",
        withheld: Callable[..., None] | None = None,
    ) -> None:
        # Set when the daemon may not change nodes (observe mode, [recovery] enabled = false):
        # findings are recorded and the drains/resumes they call for are withheld.
        self.withheld = withheld
        self.config = config
        self.store = store
        self.slurm = slurm
        # Drains and resumes go through the node executor; the drift store records them.
        self._nodes = NodeActions(None, slurm, lambda: datetime.now(UTC))
        self.probes = dict(probes)
        self.runner = runner
        self.actor = actor
        self._partitions = config.partitions()
        self._policies = {name: Policy(p.default_policy) for name, p in self.probes.items()}
        self._policies.update(config.policies)
        # Fixed per probe for the daemon's life: settings were validated at config load.
        self._commands = {name: cmd for name, p in self.probes.items()
                          if (cmd := p.command(config.settings)) is not None}

    def scan(self, nodes: Sequence[str] | None, now: datetime) -> ScanResult:
        """Probe ``nodes`` (default: every configured node), act on what differs, record it."""
        return self.apply(self.collect(nodes), now)

    def _report_failures(self, failures: Sequence[tuple[str | None, str]], now: datetime,
                         actor: str) -> None:
        """A failed drain/resume/sinfo of a scan: a warning and an event, every time."""
        if not failures:
            return
        for node, error in failures:
            log.warning("drift.action_failed", node=node, error=error)
        self.store.record_action_failures(failures, now, actor)

    def collect(self, nodes: Sequence[str] | None) -> Collected:
        """Run every probe on ``nodes`` over SSH. UsageError for a node not in [drift.nodes]."""
        targets = tuple(nodes) if nodes else tuple(self._partitions)
        unknown = sorted(set(targets) - set(self._partitions))
        if unknown:
            raise UsageError(f"node {unknown[0]!r} is not in [drift.nodes]")
        t0 = time.monotonic()
        runs = self.runner.run(targets, self._commands)
        return Collected(targets, runs, time.monotonic() - t0)

    def apply(self, collected: Collected, now: datetime, actor: str | None = None) -> ScanResult:
        """Judge what was collected against the baseline, then drain, resume and record.

        ``actor`` (default: the scanner's) is who the events name.
        """
        actor = actor or self.actor
        reports = [node_report(collected.runs.get(n) or NodeRun(n, NodeStatus.UNREACHABLE, "no result"),
                               self.probes, self._partitions[n]) for n in collected.nodes]
        last = self.store.last_scan()
        old_matrix: dict[str, Any] = last[2] if last else {}
        scanned = set(collected.nodes)
        others = [r for r in reports_from_matrix(old_matrix)
                  if r.node not in scanned and r.node in self._partitions]
        findings = find_differences([*reports, *others], self.config.pinned, self._policies, judge=scanned)
        matrix = _merge(old_matrix, reports, now, self._partitions)
        open_findings = self.store.open_findings()
        drained = self.store.drained_nodes()
        errors: list[str] = []
        reasons: dict[str, str] = {}
        if any(f.policy is Policy.DRAIN for f in findings) or drained:
            try:
                reasons = {n.name: n.reason for n in self.slurm.nodes()}
            except SlurmError as exc:
                # Without Slurm's view we could overwrite a person's drain: act next time.
                errors.append(f"sinfo: {exc}")
                plan = plan_actions(reports, findings, open_findings, drained, {})
                self.store.record_scan(now, now, len(scanned), matrix,
                                       plan.open, plan.close, actor)
                self._report_failures([(None, f"sinfo: {exc}")], now, actor)
                return _result(now, collected, reports, findings, plan.open, plan.close, (), (), errors)
        plan = plan_actions(reports, findings, open_findings, drained, reasons)
        self.store.record_scan(now, now, len(scanned), matrix,
                               plan.open, plan.close, actor)
        for f in plan.open:
            log.warning("drift.finding", node=f.node, probe=f.probe, kind=f.kind.value,
                        expected=f.expected, found=f.found, policy=f.policy.value)
        drained_now: list[str] = []
        failures: list[tuple[str | None, str]] = []
        for node, reason in plan.drain:
            if self.withheld is not None:
                self.withheld("drain", node, now, node=node, detail=reason)
                continue
            if reasons and node not in reasons:
                # Not a Slurm node (sinfo does not list it): reported, never drained.
                failures.append((node, f"drain {node}: not a Slurm node (not in sinfo)"))
                errors.append(failures[-1][1])
                continue
            try:
                # Recorded by the drift store (its own table and drift.drained).
                self._nodes.drain(node, reason, nodes_now={}, record=False)
            except SlurmError as exc:
                errors.append(f"drain {node}: {exc}")
                failures.append((node, errors[-1]))
                continue
            self.store.mark_drained(node, reason, now, actor)
            drained_now.append(node)
            log.warning("drift.drained", node=node, reason=reason)
        resumed: list[str] = []
        for node in released(drained, reports, findings):
            if node in plan.resume and self.withheld is not None:
                self.withheld("resume", node, now, node=node, detail="its drift finding cleared")
                continue
            if node in plan.resume:
                try:
                    self._nodes.resume(node, record=False)
                except SlurmError as exc:
                    errors.append(f"resume {node}: {exc}")
                    failures.append((node, errors[-1]))
                    continue
                resumed.append(node)
                log.info("drift.resumed", node=node)
            self.store.release(node, now, resumed=node in plan.resume, actor=actor)
        self._report_failures(failures, now, actor)
        return _result(now, collected, reports, findings, plan.open, plan.close,
                       tuple(drained_now), tuple(resumed), errors)


def _result(now: datetime, collected: Collected, reports: Sequence[NodeReport], findings: Sequence[Any],
            opened: Sequence[Any], closed: Sequence[Any], drained: tuple[str, ...],
            resumed: tuple[str, ...], errors: Sequence[str]) -> ScanResult:
    return ScanResult(started_at=now, wall_s=collected.wall_s, reports=tuple(reports),
                      findings=tuple(findings), opened=tuple(opened),
                      closed=tuple(o.finding for o in closed), drained=drained, resumed=resumed,
                      errors=tuple(errors))


def report_to_json(report: NodeReport, scanned_at: datetime) -> dict[str, Any]:
    return {"partition": report.partition, "status": report.status.value, "error": report.error,
            "scanned_at": scanned_at.isoformat(),
            "values": {k: {"status": v.status.value, "value": v.value, "detail": v.detail}
                       for k, v in sorted(report.values.items())}}


def reports_from_matrix(matrix: Mapping[str, Any]) -> list[NodeReport]:
    """The node reports a stored matrix holds (the inverse of :func:`report_to_json`)."""
    out = []
    for node, row in sorted(matrix.items()):
        values = {k: ProbeValue(ProbeStatus(v["status"]), v.get("value", ""), v.get("detail", ""))
                  for k, v in row.get("values", {}).items()}
        out.append(NodeReport(node, row.get("partition", "default"), NodeStatus(row["status"]),
                              row.get("error", ""), values))
    return out


def _merge(old: Mapping[str, Any], reports: Sequence[NodeReport], now: datetime,
           configured: Mapping[str, str]) -> dict[str, Any]:
    # Nodes taken out of [drift.nodes] leave the matrix.
    merged = {node: row for node, row in old.items() if node in configured}
    for r in reports:
        merged[r.node] = report_to_json(r, now)
    return merged


def build_drift_scanner(config: DriftConfig, store: Store, slurm: SlurmClient,
                        plugins: PluginRegistry, withheld: Callable[..., None] | None = None) -> DriftScanner:
    """The daemon's scanner: the probe plugins of ``plugins``, paramiko, the SQL store;
    ``withheld`` set: it drains and resumes nothing (see :class:`DriftScanner`)."""
    from .plugins import load_probes
    from .ssh import ParamikoRunner

    probes = load_probes(config.probes, plugins)
    return DriftScanner(config, store.drift, slurm, probes=probes,
                        runner=ParamikoRunner(config.ssh, config.endpoints()), withheld=withheld)


def scan_result_to_dict(result: ScanResult) -> dict[str, Any]:
    """The JSON form of a scan, as the daemon returns it to ``drift scan``."""
    return {"started_at": result.started_at.isoformat(), "wall_s": round(result.wall_s, 3),
            "nodes": {r.node: report_to_json(r, result.started_at) for r in result.reports},
            "findings": [finding_to_dict(f) for f in result.findings],
            "opened": [finding_to_dict(f) for f in result.opened],
            "closed": [finding_to_dict(f) for f in result.closed],
            "drained": list(result.drained), "resumed": list(result.resumed), "errors": list(result.errors)}


def finding_to_dict(f: Finding) -> dict[str, Any]:
    return {"node": f.node, "probe": f.probe, "kind": f.kind.value, "expected": f.expected,
            "found": f.found, "policy": f.policy.value}
