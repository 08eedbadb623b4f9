"""The pure decisions of a drift scan: parse, compare with a baseline, plan actions.

No I/O and no clock here: the scanner feeds in what SSH returned and what the
store and Slurm know, and carries out the :class:`~.records.Plan` it gets back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence

from ..interfaces import DriftProbe
from .scan_records import (
    Finding,
    FindingKind,
    NodeReport,
    NodeRun,
    NodeStatus,
    OpenFinding,
    Plan,
    Policy,
    ProbeStatus,
    ProbeValue,
)

#: Drain reasons start with this, so a later scan knows which drains are its own.
REASON_PREFIX = "drift:"
_MAX_FOUND = 200


def parse_probe(probe: DriftProbe, result_code: int | None, stdout: str, stderr: str) -> ProbeValue:
    """One probe's value from its command's result; never raises."""
    if result_code is None:
        return ProbeValue(ProbeStatus.TIMEOUT)
    if result_code != 0:
        why = (stderr.strip() or stdout.strip()).splitlines()
        return ProbeValue(ProbeStatus.FAILED, detail=f"exit {result_code}: {why[0][:160] if why else ''}")
    try:
        value = probe.parse(stdout)
    except Exception as exc:
        # A third-party parser may raise anything; bad output is a finding, not a crash.
        first = stdout.strip().splitlines()
        return ProbeValue(ProbeStatus.UNPARSEABLE,
                          detail=f"{type(exc).__name__}: {first[0][:120] if first else '(no output)'}")
    return ProbeValue(ProbeStatus.OK, value=value)


def node_report(run: NodeRun, probes: Mapping[str, DriftProbe], partition: str) -> NodeReport:
    """The matrix row of one node from its SSH results.

    A node where any probe timed out is reported TIMEOUT as a whole: a hung
    ``nvidia-smi`` says the node is unwell, not that its versions differ.
    """
    if run.status is not NodeStatus.OK:
        return NodeReport(run.node, partition, run.status, run.error)
    values: dict[str, ProbeValue] = {}
    for name, probe in probes.items():
        result = run.results.get(name)
        if result is None:
            continue
        values[name] = parse_probe(probe, result.exit_code, result.stdout, result.stderr)
    timed_out = sorted(n for n, v in values.items() if v.status is ProbeStatus.TIMEOUT)
    if timed_out:
        return NodeReport(run.node, partition, NodeStatus.TIMEOUT,
                          f"probe {', '.join(timed_out)} did not finish", values)
    return NodeReport(run.node, partition, NodeStatus.OK, "", values)


def expected_values(
    reports: Sequence[NodeReport], pinned: Mapping[str, str]
) -> dict[tuple[str, str], str | None]:
    """The baseline per (partition, probe): the pinned value, else the one majority value.

    ``None`` means no baseline: the most common value is shared by another
    value as often (a split), so no node can be called the odd one out.
    """
    counts: dict[tuple[str, str], Counter[str]] = {}
    for report in reports:
        if report.status is not NodeStatus.OK:
            continue
        for probe, value in report.values.items():
            if value.status is ProbeStatus.OK:
                counts.setdefault((report.partition, probe), Counter())[value.value] += 1
    expected: dict[tuple[str, str], str | None] = {}
    for key, counter in counts.items():
        if key[1] in pinned:
            expected[key] = pinned[key[1]]
            continue
        top = counter.most_common(2)
        expected[key] = None if len(top) > 1 and top[0][1] == top[1][1] else top[0][0]
    for report in reports:
        for probe in report.values:
            if probe in pinned:
                expected[(report.partition, probe)] = pinned[probe]
    return expected


def find_differences(
    reports: Sequence[NodeReport],
    pinned: Mapping[str, str],
    policies: Mapping[str, Policy],
    judge: Collection[str] | None = None,
) -> list[Finding]:
    """Every finding among the OK nodes in ``judge`` (default: all), sorted by node and probe.

    The baseline is taken from all ``reports`` (also nodes not judged, such
    as the last known values of nodes this scan did not reach). Drift follows
    the probe's policy (default drain); unparseable, failed and split
    findings only warn, since they may be our parser's or the tool's fault.
    """
    expected = expected_values(reports, pinned)
    findings: list[Finding] = []
    for report in reports:
        if report.status is not NodeStatus.OK or (judge is not None and report.node not in judge):
            continue
        for probe, value in sorted(report.values.items()):
            exp = expected.get((report.partition, probe))
            policy = policies.get(probe, Policy.WARN)
            if value.status is ProbeStatus.UNPARSEABLE:
                findings.append(Finding(report.node, probe, FindingKind.UNPARSEABLE, exp or "",
                                        value.detail[:_MAX_FOUND], Policy.WARN))
            elif value.status is ProbeStatus.FAILED:
                findings.append(Finding(report.node, probe, FindingKind.FAILED, exp or "",
                                        value.detail[:_MAX_FOUND], Policy.WARN))
            elif exp is None:
                findings.append(Finding(report.node, probe, FindingKind.SPLIT, "",
                                        value.value[:_MAX_FOUND], Policy.WARN))
            elif value.value != exp:
                findings.append(Finding(report.node, probe, FindingKind.DRIFT, exp,
                                        value.value[:_MAX_FOUND], policy))
    return findings


def drain_reason(findings: Sequence[Finding]) -> str:
    """``drift: nccl 2.21.5 != 2.23.4; driver 570.1 != 580.2`` (found first, then expected)."""
    parts = [f"{f.probe} {f.found} != {f.expected}" for f in findings]
    return f"{REASON_PREFIX} " + "; ".join(parts)


def plan_actions(
    reports: Sequence[NodeReport],
    findings: Sequence[Finding],
    open_findings: Sequence[OpenFinding],
    drained_by_us: Collection[str],
    slurm_reasons: Mapping[str, str],
) -> Plan:
    """What to change after a scan.

    Only nodes reported OK are judged: an unreachable or hung node keeps its
    open findings and its drain (nothing is known about it). A finding that
    is new, or whose values changed, is opened (the old one closed); an open
    finding on an OK node that the scan no longer shows is closed. A node
    with drift under a drain policy is drained unless the daemon already
    did, or the node has a reason in Slurm that is not ours (a person's
    drain stays as it is); a node the daemon drained that now shows none is
    resumed, but only while Slurm still shows a drift reason.
    """
    ok_nodes = {r.node for r in reports if r.status is NodeStatus.OK}
    current = {f.key: f for f in findings if f.node in ok_nodes}
    by_key = {of.finding.key: of for of in open_findings}
    to_open = [f for key, f in current.items() if key not in by_key or by_key[key].finding != f]
    to_close = [of for key, of in by_key.items()
                if of.finding.node in ok_nodes and (key not in current or current[key] != of.finding)]
    draining: dict[str, list[Finding]] = {}
    for f in current.values():
        if f.kind is FindingKind.DRIFT and f.policy is Policy.DRAIN:
            draining.setdefault(f.node, []).append(f)
    # Never overwrite a person's drain or down reason with ours.
    drain = tuple((node, drain_reason(fs)) for node, fs in sorted(draining.items())
                  if node not in drained_by_us
                  and (not slurm_reasons.get(node) or slurm_reasons[node].startswith(REASON_PREFIX)))
    resume = tuple(sorted(node for node in drained_by_us if node in ok_nodes and node not in draining
                          and slurm_reasons.get(node, "").startswith(REASON_PREFIX)))
    return Plan(open=tuple(to_open), close=tuple(to_close), drain=drain, resume=resume)


def released(drained_by_us: Collection[str], reports: Sequence[NodeReport],
             findings: Sequence[Finding]) -> list[str]:
    """Nodes whose drift drain the daemon stops tracking: OK now and without drain findings."""
    ok_nodes = {r.node for r in reports if r.status is NodeStatus.OK}
    draining = {f.node for f in findings if f.kind is FindingKind.DRIFT and f.policy is Policy.DRAIN}
    return sorted(n for n in drained_by_us if n in ok_nodes and n not in draining)
