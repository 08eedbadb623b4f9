"""``b300ctl submit --dry-run SPEC``: what ``submit`` would send to Slurm, sending nothing.

The spec is checked as the daemon checks it; the exclusions are computed from the
state store, opened read-only, as the daemon computes them for a new run (nodes
with open drift findings of drain policy, trimmed so that the run still fits its
partition); the black-hole nodes are listed beside them; the resume point is the
newest verified checkpoint in the spec's checkpoint folder. Nothing is submitted
to Slurm and nothing is written to the store (the only Slurm call is ``sinfo``
for the partition's nodes, when there is anything to exclude). The drift view is
the store's: the daemon scans stale nodes again before a real submission.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..errors import SlurmError, UsageError
from .command import Context
from .output import print_json


@dataclass(frozen=True, slots=True)
class DryRun:
    """Everything ``--dry-run`` found, as plain data (rendered by :func:`render`)."""

    spec_path: str
    run_id: str
    argv: tuple[str, ...]
    script: str
    excluded: tuple[tuple[str, str], ...]   # (node, why) kept in the exclude list
    dropped: tuple[tuple[str, str], ...]    # (node, why) a candidate left out
    black_holes: tuple[tuple[str, tuple[str, ...]], ...]  # (node, the runs it failed)
    checkpoint_dir: str
    resume_from: str | None
    checked: tuple[dict[str, object], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"dry_run": True, "spec": self.spec_path, "run_id_example": self.run_id,
                "sbatch_argv": list(self.argv), "script": self.script,
                "exclude": [{"node": n, "why": w} for n, w in self.excluded],
                "exclusions_dropped": [{"node": n, "why": w} for n, w in self.dropped],
                "black_holes": [{"node": n, "runs": list(r)} for n, r in self.black_holes],
                "checkpoint_dir": self.checkpoint_dir or None, "resume_from": self.resume_from,
                "checkpoints_checked": list(self.checked)}


def render(d: DryRun) -> str:
    """The operator's text: what would be excluded and resumed, the command, the script."""
    lines = [f"dry run of {d.spec_path}: nothing submitted, nothing recorded",
             f"run id: chosen at submission (like {d.run_id}); first attempt's job name "
             f"b300-<run id>-a1"]
    lines.append("exclude: " + (", ".join(f"{n} ({w})" for n, w in d.excluded) or "none"))
    lines += [f"not excluded: {n} ({w})" for n, w in d.dropped]
    lines.append("black-hole nodes: " + (", ".join(
        f"{n} (failed runs {', '.join(r)})" for n, r in d.black_holes) or "none")
        + (" -- not in a new run's exclude list: b300d's recovery drains black-hole nodes"
           if d.black_holes else ""))
    if not d.checkpoint_dir:
        lines.append("resume point: start from scratch (the spec has no [checkpoint] dir)")
    elif d.resume_from is None:
        lines.append(f"resume point: start from scratch (no verified checkpoint in {d.checkpoint_dir})")
    else:
        lines.append(f"resume point: {d.resume_from} (newest verified checkpoint in {d.checkpoint_dir}; "
                     "a new run's first attempt starts with B300_RESUME_FROM empty and may find it "
                     "itself through B300_CHECKPOINT_DIR; b300d gives later attempts the newest "
                     "verified one)")
    lines.append("sbatch command (the script on its stdin): " + shlex.join(d.argv))
    lines += ["batch script:", d.script.rstrip("\n")]
    return "\n".join(lines)


def run_dry(ctx: Context, args: argparse.Namespace) -> int:
    """Validate the spec as ``submit`` does and print what would be submitted; exit 0."""
    print_result(ctx, plan_submission(ctx, args.spec))
    return 0


def print_result(ctx: Context, d: DryRun) -> None:
    if ctx.json:
        print_json(d.to_dict())
    else:
        print(render(d))


def plan_submission(ctx: Context, spec_path: str) -> DryRun:
    """Read the spec, the store (read-only) and the partition; change nothing."""
    from ..checkpoints.access import checkpoint_dir_problem
    from ..checkpoints.resume_point import newest_verified
    from ..cycle.run_actions import new_run_id
    from ..events import STRIKE_RESETS, STRIKES
    from ..recovery.classify import BlackHolePolicy, black_holes, last_returns
    from ..recovery.exclusions import Exclusion, plan_exclusions
    from ..slurm.cli import CliSlurmClient, sbatch_argv
    from ..slurm.script import build_request
    from ..spec import load_spec_file, parse_spec
    from ..store import open_store_for_reading

    cfg = ctx.config()
    _spec, text = load_spec_file(spec_path)
    spec = parse_spec(text, where=spec_path)  # what the daemon parses: the stored text
    if spec.checkpoint.dir and (why := checkpoint_dir_problem(spec.checkpoint.dir, cfg.checkpoints.roots)):
        raise UsageError(why)
    now = ctx.clock()
    with open_store_for_reading(cfg.database_url) as store:
        known = {n.name for n in store.list_nodes()}
        drifted = store.drift.open_drift_nodes() & known if cfg.drift is not None else set()
        holes = []
        if cfg.recovery.enabled:
            policy = BlackHolePolicy(cfg.recovery.blackhole_failures, cfg.recovery.blackhole_window_s)
            since = now - timedelta(seconds=policy.window_s)
            back = last_returns(store.events(kinds=list(STRIKE_RESETS), since=since))
            holes = black_holes(store.events(kinds=list(STRIKES), since=since), policy, now, back)
        nodes_now = {n.name: n for n in store.list_nodes()}
    candidates = [Exclusion(n, "drift", "open drift finding") for n in sorted(drifted)]
    partition: list[str] | None = None
    if candidates:
        slurm = CliSlurmClient(slurm_conf=cfg.slurm_conf, bin_dir=cfg.slurm_bin_dir,
                               timeout=cfg.slurm_timeout_s)
        try:
            partition = slurm.partition_nodes(spec.partition)
        except SlurmError:
            partition = None  # as the daemon: no fit check when the partition is unknown
    plan = plan_exclusions(candidates, nodes_now=nodes_now, drift=drifted,
                           black_holes={h.node for h in holes}, partition_nodes=partition,
                           needed=spec.nodes)
    resume, checked = newest_verified(spec)
    run_id = new_run_id(spec.name)
    try:
        request = build_request(spec, run_id=run_id, attempt=1, excluded_nodes=tuple(plan.nodes),
                                log_dir=cfg.job_log_dir or None)
    except ValueError as exc:  # spare_nodes without a job_log_dir
        raise UsageError(f"{spec_path}: {exc}") from None
    return DryRun(
        spec_path=spec_path, run_id=run_id, argv=tuple(sbatch_argv(request)), script=request.script,
        excluded=tuple((e.node, e.detail) for e in plan.kept),
        dropped=tuple((e.node, why) for e, why in plan.dropped),
        black_holes=tuple((h.node, h.runs) for h in holes),
        checkpoint_dir=spec.checkpoint.dir or "", resume_from=resume, checked=tuple(checked))
