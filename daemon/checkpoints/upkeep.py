"""The daemon's checkpoint upkeep: copy offsite, then prune, every ``maintain_interval``.

For each run that is not ended (and each run that ended in the last week, whose
final checkpoints still need their copies), in this order:

1. finish any delete an earlier prune left half done (``.b300-deleting-*``);
2. **replicate**: every complete checkpoint with a manifest that some
   configured target does not hold yet is copied there, newest first, at most
   ``replicas_per_pass`` copies per pass, under one bandwidth limit
   (:func:`b300.checkpoints.replicate.replicate` resumes an interrupted copy
   and verifies it before it writes the replica record); the outcome is recorded;
3. **prune locally** (when ``prune = true``) by the retention rules, which keep
   the newest verified checkpoint, anything a pending resume points at, and
   anything not yet copied to every target. Before deleting, each target is asked
   again whether it still holds the replica (a copy deleted by hand since is
   copied again instead of trusted); the plan's anchor is verified again; the
   pending resumes are read again under the daemon's action lock, so recovery
   cannot pick a checkpoint while it is being deleted. A ``checkpoint.prune_started``
   event (the intent) is written before the first delete and ``checkpoint.pruned``
   after;
4. **prune the targets** (when ``prune_remote = true``) by the same rules over
   their replica records, after reading the newest replica back intact.

Nothing here raises into the scheduler: a target that is down is logged (and an
event raised once, when it goes down) and retried on the next pass.

:meth:`CheckpointUpkeep.prune_request` is step 1 and 3 for one run, now, asked by a
person (``b300ctl checkpoints RUN --prune --yes``, control op ``checkpoints_prune``),
with the retention options given and that person as the actor of the events.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import structlog

from ..errors import B300Error, UsageError
from ..events import Kind
from ..interfaces import CheckpointRepository, NewEvent, ReplicaLister, ReplicationTarget, Store
from ..model import CheckpointInfo, Run
from ..plugin_registry import PluginRegistry
from ..spec import parse_spec
from .checkpoint_pass import runs_to_look_after
from .entries import plan_state
from .layouts import load_layout
from .manifest import read_manifest, verify
from .policy import CheckpointsConfig, TargetConfig
from .prune import anchor_of, finish_interrupted_deletes, plan_remote_prune, prune_local, prune_remote
from .replicate import Throttle, load_target, replica_name, replicate
from .resume import pending_resumes
from .retention import PrunePlan, RetentionPolicy, plan_prune, requested_policy

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class LocalPrune:
    """What one local prune of a run did: ``deleted`` paths, ``kept`` paths with why, and
    ``refused`` (why it stopped short) or ``unconfirmed`` (kept: a target lost its copy)."""

    run_id: str
    deleted: tuple[str, ...] = ()
    kept: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    refused: str = ""
    unconfirmed: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The daemon's answer to ``checkpoints_prune`` (what ``b300ctl checkpoints --prune --yes`` prints)."""
        return {"run": self.run_id, "deleted": list(self.deleted),
                "kept": {path: list(why) for path, why in self.kept.items()},
                "refused": self.refused, "unconfirmed": list(self.unconfirmed)}


class CheckpointUpkeep:
    """One object for the daemon's life; :meth:`run_once` is the scheduled job."""

    def __init__(
        self,
        store: Store,
        checkpoints: CheckpointRepository,
        config: CheckpointsConfig,
        clock: Callable[[], datetime],
        *,
        action_lock: threading.Lock,
        plugins: PluginRegistry,
        stopping: Callable[[], bool] = lambda: False,
        fence: Callable[[str], None] = lambda _action: None,
        withheld: Callable[..., None] | None = None,
    ) -> None:
        # With prune off (or the daemon observing), the deletes the rules would make are
        # recorded through ``withheld`` (b300.safety.mode.Withheld) instead.
        self._withheld = withheld
        # Proves the lease before every delete and copy (b300.ha.fence); raises if it cannot.
        self._fence = fence
        self._store = store
        self._checkpoints = checkpoints
        self._cfg = config
        self._clock = clock
        self._lock = action_lock
        self._stopping = stopping
        self._plugins = plugins
        self._down: set[tuple[str, str]] = set()  # (run, target) known to be unreachable

    def run_once(self) -> None:
        """One pass; failures are logged, never raised into the scheduler."""
        try:
            self._pass()
        except B300Error as exc:
            log.warning("checkpoints.upkeep_failed", error=str(exc))
        except Exception:
            log.exception("checkpoints.upkeep_crashed")

    def prune_request(self, run_id: str, *, actor: str, keep_last: object = None,
                      keep_hourly_for: object = None, keep_daily_for: object = None) -> dict[str, Any]:
        """The control op ``checkpoints_prune``: :meth:`prune_now` with the configured
        retention overridden by the options given (None: the configured value); its answer."""
        policy = requested_policy(self._cfg.retention, keep_last=keep_last,
                                  keep_hourly_for=keep_hourly_for, keep_daily_for=keep_daily_for)
        return self.prune_now(run_id, policy=policy, actor=actor).to_dict()

    def prune_now(self, run_id: str, *, policy: RetentionPolicy, actor: str) -> LocalPrune:
        """Prune one run's local checkpoints now, as a pass does (finish interrupted deletes,
        list, confirm every replica on its target, re-verify the anchor and re-read the
        pending resumes under the action lock, intent event, rename-then-delete), with
        ``policy`` and ``actor`` on the events. Asked by a person, so ``[checkpoints] prune``
        need not be on; remote copies are left to the pass. Must not be called holding the
        action lock (it takes it for the deletes). Raises NotFoundError for an unknown run,
        UsageError for a run without a checkpoint dir, B300Error when a target fails."""
        run = self._store.get_run(run_id)
        spec = parse_spec(run.spec_toml, where=f"run {run.id}")
        root = spec.checkpoint.dir
        if not root:
            raise UsageError(f"run {run.id} has no checkpoint dir")
        self._fence(f"checkpoint prune of run {run.id} for {actor}")
        leftovers = finish_interrupted_deletes(root)
        if leftovers:
            log.info("checkpoints.finished_interrupted_delete", run=run.id, paths=list(leftovers))
        found = load_layout(spec.checkpoint.layout, self._plugins).list_checkpoints(root)
        self._checkpoints.record_listing(run.id, found, self._clock())
        try:
            with ExitStack() as stack:
                targets = {t.name: self._open(run.id, t, stack) for t in self._cfg.targets}
                return self._prune_local(run, root, found, targets, policy=policy, actor=actor)
        except B300Error:
            raise
        except Exception as exc:  # a target failing mid-way (socket, SSH, botocore)
            raise B300Error(f"prune of run {run.id} stopped: {_describe(exc)}") from exc

    def _pass(self) -> None:
        throttle = Throttle(self._cfg.bandwidth_limit)
        budget = [self._cfg.replicas_per_pass]
        for run in runs_to_look_after(self._store, self._clock()):
            if self._stopping():
                return
            try:
                self._run(run, throttle, budget)
            except B300Error as exc:
                log.warning("checkpoints.upkeep_run_failed", run=run.id, error=str(exc))
            except Exception as exc:  # a target failing mid-way (socket, SSH, botocore): next run
                log.warning("checkpoints.upkeep_run_failed", run=run.id,
                            error=_describe(exc))

    def _run(self, run: Run, throttle: Throttle, budget: list[int]) -> None:
        spec = parse_spec(run.spec_toml, where=f"run {run.id}")
        root = spec.checkpoint.dir
        if not root:
            return
        self._fence(f"checkpoint upkeep of run {run.id}")
        leftovers = finish_interrupted_deletes(root)
        if leftovers:
            log.info("checkpoints.finished_interrupted_delete", run=run.id, paths=list(leftovers))
        found = load_layout(spec.checkpoint.layout, self._plugins).list_checkpoints(root)
        self._checkpoints.record_listing(run.id, found, self._clock())
        with ExitStack() as stack:
            targets = {t.name: self._open(run.id, t, stack) for t in self._cfg.targets}
            for t in self._cfg.targets:
                target = targets[t.name]
                if target is not None:
                    self._replicate(run.id, found, t.name, target, throttle, budget)
            if self._cfg.prune and not self._stopping():
                self._prune_local(run, root, found, targets)
            elif self._withheld is not None:
                now = self._clock()
                for c in self._plan(run.id, found, self._pending(run.id), self._cfg.retention).delete:
                    self._withheld("delete", c.path, now, run_id=run.id,
                                   detail="the retention rules would delete this checkpoint")
            if self._cfg.prunes_remote and not self._stopping():
                for name, target in targets.items():
                    if target is not None:
                        self._prune_remote(run, name, target)

    # -- targets ------------------------------------------------------------

    def _open(self, run_id: str, t: TargetConfig, stack: ExitStack) -> ReplicationTarget | None:
        key = (run_id, t.name)
        try:
            target = load_target(t.kind, t.options_for(run_id), self._plugins)
        except Exception as exc:  # a plugin's connect may raise anything (socket, auth, botocore)
            error = _describe(exc)
            log.warning("checkpoints.target_unavailable", run=run_id, target=t.name, error=error)
            if key not in self._down:
                self._down.add(key)
                self._store.append_events([NewEvent(Kind.CHECKPOINT_TARGET_UNAVAILABLE, run_id=run_id,
                                                    data={"target": t.name, "error": error})], self._clock())
            return None
        stack.callback(target.close)
        if key in self._down:
            self._down.discard(key)
            self._store.append_events([NewEvent(Kind.CHECKPOINT_TARGET_OK, run_id=run_id,
                                                data={"target": t.name})], self._clock())
        return target

    # -- replication ----------------------------------------------------------

    def _replicate(self, run_id: str, found: list[CheckpointInfo], name: str, target: ReplicationTarget,
                   throttle: Throttle, budget: list[int]) -> None:
        known = {c.info.path: c for c in self._checkpoints.checkpoints(run_id)}
        for ckpt in sorted(found, key=lambda c: c.step, reverse=True):
            if budget[0] <= 0 or self._stopping():
                return
            stored = known.get(ckpt.path)
            if not ckpt.complete or stored is None or stored.verified is not True:
                continue
            if stored.replicas.get(name):
                continue
            manifest = read_manifest(ckpt.path)
            if manifest is None:
                continue
            budget[0] -= 1
            try:
                result = replicate(ckpt, manifest, target, concurrency=self._cfg.replication_concurrency,
                                   throttle=throttle)
            except Exception as exc:  # network, permissions, the server going away mid-copy
                error = _describe(exc)
                log.warning("checkpoints.replication_interrupted", run=run_id, target=name,
                            path=ckpt.path, error=error)
                self._checkpoints.record_replica(run_id, ckpt.path, name, False, self._clock(), error=error)
                return  # the target is in trouble; the next pass resumes the copy
            if not result.ok:
                local = verify(ckpt.path)
                if not local.ok:
                    self._checkpoints.record_verification(run_id, ckpt.path, False, self._clock(),
                                                          local.problems)
            self._checkpoints.record_replica(run_id, ckpt.path, name, result.ok, self._clock(),
                                             bytes_sent=result.bytes_sent,
                                             error="; ".join(result.problems)[:1000])
            log.info("checkpoints.replicated" if result.ok else "checkpoints.replication_failed",
                     run=run_id, target=name, path=ckpt.path, bytes_sent=result.bytes_sent,
                     files_sent=result.files_sent, files_skipped=result.files_skipped)

    # -- pruning ----------------------------------------------------------------

    def _pending(self, run_id: str) -> set[str]:
        return pending_resumes(self._store.attempts(run_id))

    def _plan(self, run_id: str, found: list[CheckpointInfo], pending: set[str],
              policy: RetentionPolicy) -> PrunePlan:
        known = {c.info.path: c for c in self._checkpoints.checkpoints(run_id)}
        states = [plan_state(c, known.get(c.path)) for c in found]
        return plan_prune(states, policy, self._clock(), pending_resume=pending,
                          replication_targets=[t.name for t in self._cfg.targets])

    def _prune_local(self, run: Run, root: str, found: list[CheckpointInfo],
                     targets: Mapping[str, ReplicationTarget | None], *,
                     policy: RetentionPolicy | None = None, actor: str = "daemon") -> LocalPrune:
        """Delete what the retention plan says, after the re-checks the module docstring lists."""
        policy = policy or self._cfg.retention
        plan = self._plan(run.id, found, self._pending(run.id), policy)
        if not plan.delete:
            return LocalPrune(run.id, kept=plan.keep)
        down = sorted(name for name, t in targets.items() if t is None)
        if down:
            # Cannot confirm the copies on a target that is down: delete nothing.
            return LocalPrune(run.id, kept=plan.keep, refused=f"target {', '.join(down)} unreachable: "
                              "the copies there cannot be confirmed; nothing deleted")
        missing = self._unconfirmed(run.id, plan, targets)
        anchor = anchor_of(plan)
        anchor_ok = anchor is not None and verify(anchor).ok
        with self._lock:
            # Recovery picks resume points under this lock: read them again here.
            again = self._plan(run.id, found, self._pending(run.id), policy)
            if anchor_of(again) != anchor:
                return LocalPrune(run.id, kept=again.keep, refused="the newest verified checkpoint "
                                  "changed meanwhile; nothing deleted (the next pass plans afresh)")
            planned = {c.path for c in plan.delete}
            # lexists: another prune of this run (a pass, a request) may have got there first.
            delete = tuple(c for c in again.delete
                           if c.path in planned and c.path not in missing and os.path.lexists(c.path))
            if not delete:
                return LocalPrune(run.id, kept=again.keep, unconfirmed=tuple(sorted(missing)))
            self._fence(f"delete {len(delete)} checkpoints of run {run.id}")
            self._store.append_events([NewEvent(Kind.CHECKPOINT_PRUNE_STARTED, run_id=run.id, actor=actor,
                                                data={"paths": [c.path for c in delete]})], self._clock())
            result = prune_local(PrunePlan(keep=again.keep, delete=delete), root, dry_run=False,
                                 verify=lambda p: p == anchor and anchor_ok)
            if result.refused:
                log.warning("checkpoints.prune_refused", run=run.id, why=result.refused)
                self._store.append_events([NewEvent(Kind.CHECKPOINT_PRUNE_REFUSED, run_id=run.id, actor=actor,
                                                    data={"why": result.refused})], self._clock())
            if result.deleted:
                self._checkpoints.record_pruned(run.id, result.deleted, self._clock(), actor=actor)
                log.info("checkpoints.pruned", run=run.id, deleted=len(result.deleted), by=actor)
            return LocalPrune(run.id, deleted=result.deleted, kept=again.keep, refused=result.refused,
                              unconfirmed=tuple(sorted(missing)))

    def _unconfirmed(self, run_id: str, plan: PrunePlan,
                     targets: Mapping[str, ReplicationTarget | None]) -> set[str]:
        """Paths the plan deletes whose replica a target no longer holds (and did not prune itself)."""
        known = {c.info.path: c for c in self._checkpoints.checkpoints(run_id)}
        missing: set[str] = set()
        for name, target in targets.items():
            assert target is not None
            for info in plan.delete:
                stored = known.get(info.path)
                if stored is None or not info.complete or name in stored.replicas_pruned:
                    continue
                if target.get_record(replica_name(info)) is None:
                    missing.add(info.path)
                    log.warning("checkpoints.replica_missing", run=run_id, target=name, path=info.path)
                    self._checkpoints.record_replica(run_id, info.path, name, False, self._clock(),
                                                     error=f"replica no longer on {name}; copying again")
        return missing

    def _prune_remote(self, run: Run, name: str, target: ReplicationTarget) -> None:
        pending = {os.path.basename(p.rstrip("/")) for p in self._pending(run.id)}
        plan = plan_remote_prune(target, self._cfg.retention, self._clock(), pending_resume=pending)
        if plan.delete:
            names = [c.path for c in plan.delete]
            self._fence(f"delete {len(names)} replicas of run {run.id} on {name}")
            self._store.append_events([NewEvent(Kind.CHECKPOINT_REPLICA_PRUNE_STARTED, run_id=run.id,
                                                data={"target": name, "replicas": names})], self._clock())
            result = prune_remote(target, plan, dry_run=False)
            if result.refused:
                log.warning("checkpoints.replica_prune_refused", run=run.id, target=name, why=result.refused)
                return
            by_name = {replica_name(c.info): c.info.path
                       for c in self._checkpoints.checkpoints(run.id, include_deleted=True)}
            paths = [by_name[n] for n in result.deleted if n in by_name]
            self._checkpoints.record_replicas_pruned(run.id, paths, name, self._clock())
            log.info("checkpoints.replicas_pruned", run=run.id, target=name, deleted=len(result.deleted))
        self._remove_leftovers(run.id, name, target)

    def _remove_leftovers(self, run_id: str, name: str, target: ReplicationTarget) -> None:
        """Remove replica directories without a record (an interrupted remote prune, or a
        copy begun of a checkpoint since deleted here); only names of this run's
        checkpoints that are gone from disk, nothing else that may sit on the target."""
        if not isinstance(target, ReplicaLister):
            return
        rows = self._checkpoints.checkpoints(run_id, include_deleted=True)
        gone = {replica_name(c.info) for c in rows if c.deleted_at is not None}
        on_disk = {replica_name(c.info) for c in rows if c.deleted_at is None}
        leftovers = (set(target.list_all()) - set(target.list_replicas())) & (gone - on_disk)
        if leftovers:
            self._fence(f"delete {len(leftovers)} replica leftovers of run {run_id} on {name}")
        for replica in sorted(leftovers):
            target.delete_replica(replica)
            log.info("checkpoints.replica_leftover_removed", run=run_id, target=name, replica=replica)


def _describe(exc: Exception) -> str:
    """An exception from a plugin or the network as one short log/event line."""
    return f"{type(exc).__name__}: {exc}"[:300]

