"""The pure decisions: baseline (pinned or majority), findings, drain and resume plans."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from b300.drift.baseline import drain_reason, expected_values, find_differences, node_report, plan_actions
from b300.drift.scan_records import (
    CommandResult,
    Finding,
    FindingKind,
    NodeReport,
    NodeRun,
    NodeStatus,
    OpenFinding,
    Policy,
    ProbeStatus,
    ProbeValue,
)
from b300.plugins.probes import DriverProbe, NcclProbe

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def rep(node: str, part: str = "batch", status: NodeStatus = NodeStatus.OK, **values: str) -> NodeReport:
    return NodeReport(node, part, status, "", {k: ProbeValue(ProbeStatus.OK, v) for k, v in values.items()})


def test_the_odd_node_out_of_the_partition_majority_is_drift() -> None:
    reports = [rep("a", nccl="2.23.4"), rep("b", nccl="2.23.4"), rep("c", nccl="2.21.5"),
               rep("x", "other", nccl="2.21.5")]
    findings = find_differences(reports, {}, {"nccl": Policy.DRAIN})
    assert findings == [Finding("c", "nccl", FindingKind.DRIFT, "2.23.4", "2.21.5", Policy.DRAIN)]
    assert drain_reason(findings) == "drift: nccl 2.21.5 != 2.23.4"


def test_a_pinned_value_beats_the_majority() -> None:
    reports = [rep("a", nccl="2.21.5"), rep("b", nccl="2.21.5"), rep("c", nccl="2.23.4")]
    findings = find_differences(reports, {"nccl": "2.23.4"}, {})
    assert [(f.node, f.expected, f.found) for f in findings] == [("a", "2.23.4", "2.21.5"),
                                                                 ("b", "2.23.4", "2.21.5")]


def test_a_split_has_no_baseline_and_only_warns() -> None:
    findings = find_differences([rep("a", nccl="1.0.0"), rep("b", nccl="2.0.0")], {}, {})
    assert {(f.kind, f.policy) for f in findings} == {(FindingKind.SPLIT, Policy.WARN)}


def test_unreachable_nodes_neither_vote_nor_get_judged() -> None:
    reports = [rep("a", nccl="1.0.0"), rep("b", nccl="1.0.0"),
               NodeReport("c", "batch", NodeStatus.UNREACHABLE),
               rep("d", status=NodeStatus.TIMEOUT, nccl="9.9.9")]
    assert find_differences(reports, {}, {}) == []
    assert expected_values(reports, {}) == {("batch", "nccl"): "1.0.0"}


def test_only_judged_nodes_get_findings_but_all_vote() -> None:
    reports = [rep("a", nccl="1.0.0"), rep("b", nccl="1.0.0"), rep("c", nccl="2.0.0")]
    assert find_differences(reports, {}, {}, judge={"a"}) == []
    assert len(find_differences(reports, {}, {}, judge={"c"})) == 1


@given(st.lists(st.sampled_from(["2.21.5", "2.23.4", "2.27.3"]), min_size=1, max_size=30))
def test_findings_are_exactly_the_nodes_off_a_strict_plurality(values: list[str]) -> None:
    reports = [rep(f"n{i:02d}", nccl=v) for i, v in enumerate(values)]
    findings = find_differences(reports, {}, {})
    counts = sorted(((values.count(v), v) for v in set(values)), reverse=True)
    if len(counts) > 1 and counts[0][0] == counts[1][0]:
        assert all(f.kind is FindingKind.SPLIT for f in findings) and len(findings) == len(values)
    else:
        top = counts[0][1]
        assert sorted(f.node for f in findings) == sorted(f"n{i:02d}" for i, v in enumerate(values) if v != top)


def test_node_report_marks_unparseable_failed_and_timed_out() -> None:
    probes = {"driver": DriverProbe(), "nccl": NcclProbe()}
    ok = NodeRun("a", NodeStatus.OK, results={"driver": CommandResult(0, "ERR!\n"),
                                               "nccl": CommandResult(1, "", "libnccl.so.2 not found\n")})
    r = node_report(ok, probes, "batch")
    assert r.status is NodeStatus.OK
    assert r.values["driver"].status is ProbeStatus.UNPARSEABLE
    assert r.values["nccl"] == ProbeValue(ProbeStatus.FAILED, detail="exit 1: libnccl.so.2 not found")
    kinds = {f.probe: (f.kind, f.policy) for f in find_differences([r], {}, {})}
    assert kinds == {"driver": (FindingKind.UNPARSEABLE, Policy.WARN),
                     "nccl": (FindingKind.FAILED, Policy.WARN)}
    hung = NodeRun("b", NodeStatus.OK, results={"driver": CommandResult(None), "nccl": CommandResult(0, "x")})
    assert node_report(hung, probes, "batch").status is NodeStatus.TIMEOUT
    gone = NodeRun("c", NodeStatus.UNREACHABLE, "refused")
    assert node_report(gone, probes, "batch") == NodeReport("c", "batch", NodeStatus.UNREACHABLE, "refused")


def _f(node: str, found: str = "2.21.5", policy: Policy = Policy.DRAIN) -> Finding:
    return Finding(node, "nccl", FindingKind.DRIFT, "2.23.4", found, policy)


def test_plan_drains_new_drift_and_keeps_a_persons_drain() -> None:
    reports = [rep("a"), rep("b"), rep("c")]
    plan = plan_actions(reports, [_f("a"), _f("b"), _f("c", policy=Policy.WARN)], [], set(),
                        {"b": "bad dimm (alice)"})
    assert plan.drain == (("a", "drift: nccl 2.21.5 != 2.23.4"),)
    assert [f.node for f in plan.open] == ["a", "b", "c"]


def test_plan_closes_fixed_findings_resumes_our_drains_only_and_leaves_unknown_nodes_alone() -> None:
    open_findings = [OpenFinding(1, _f("a"), T0), OpenFinding(2, _f("b"), T0), OpenFinding(3, _f("c"), T0)]
    reports = [rep("a"), rep("b"), NodeReport("c", "batch", NodeStatus.UNREACHABLE)]
    plan = plan_actions(reports, [], open_findings, {"a", "b", "c"},
                        {"a": "drift: nccl 2.21.5 != 2.23.4", "b": "replaced by bob", "c": "drift: x"})
    assert [o.id for o in plan.close] == [1, 2]
    assert plan.resume == ("a",)
    assert plan.drain == ()


def test_plan_reopens_a_finding_whose_value_changed() -> None:
    plan = plan_actions([rep("a")], [_f("a", "2.19.0")], [OpenFinding(7, _f("a"), T0)], {"a"}, {})
    assert [o.id for o in plan.close] == [7] and [f.found for f in plan.open] == ["2.19.0"]
    assert plan.drain == () and plan.resume == ()
