"""The composition root: every part of b300d built once, from the config, and wired.

Nothing else constructs the daemon's parts; tests build theirs the same way
(:func:`build_daemon` with their own store and Slurm client). No part reaches for
another through a global: what a part needs is passed in here.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from datetime import UTC, datetime

import structlog
from apscheduler.schedulers.background import BackgroundScheduler

from ..checkpoints.access import checkpoint_dir_problem
from ..checkpoints.checkpoint_pass import CheckpointPass
from ..checkpoints.policy import CheckpointsConfig
from ..checkpoints.upkeep import CheckpointUpkeep
from ..config import Config, trigger_program
from ..config.action_policy import action_policy
from ..cycle.pipeline import PollCycle
from ..cycle.requeues import RequeueReconciler
from ..cycle.run_actions import RunActions
from ..cycle.track import AttemptTracker
from ..cycle.view import ClusterObserver
from ..drift.scheduled import DriftWatch, make_drift_watch
from ..drill.runner import DrillWatch
from ..elastic.reported import ReportedDeaths
from ..errors import B300Error, SlurmError, StoreError
from ..ha.fence import Fence, FencedSlurm
from ..ha.lease import DbLease
from ..interfaces import SlurmClient, Store
from ..liveness.rounds import Confirmer
from ..ops.health import CycleHealth
from ..ops.logs import configure_logging
from ..plugin_registry import PluginRegistry
from ..recovery.hangs import HangWatch
from ..recovery.node_loss import NodeLossWatch
from ..recovery.recoverer import Recoverer, job_log_path
from ..recovery.relaunch import StepRelauncher
from ..recovery.straggler_drain import StragglerDrainer
from ..safety.mode import ACT, ActionPolicy, Withheld
from ..scheduling import table as timed
from ..spares.pools import SparePools, pool_user
from ..spec import spec_of
from ..training.health_step import TrainingWatch
from ..triage.slurm import NodeTriage
from .daemon import CycleRunner, Daemon, DaemonParts
from .lifetime import Lifetime
from .operations import Operations
from .reloader import ConfigChange, ConfigReloader
from .router import ControlRouter
from .trigger import arm_node_trigger

log = structlog.get_logger(__name__)


class _Current:
    """The config in force (replaced on a reload); parts read it through ``get``."""

    def __init__(self, config: Config) -> None:
        self.config = config

    def get(self) -> Config:
        return self.config


def build_daemon(config: Config, store: Store, slurm: SlurmClient, *,
                 plugins: PluginRegistry,
                 lease: DbLease | None = None,
                 clock: Callable[[], datetime] | None = None) -> Daemon:
    """Every part of b300d for ``config``, on ``store`` and ``slurm``, wired together; the
    plugin groups come from ``plugins`` (the one registry of the daemon's life)."""
    clock = clock or (lambda: datetime.now(UTC))
    current = _Current(config)
    lifetime = Lifetime(lease)
    lock = threading.Lock()
    # Fencing (b300.ha.fence): every changing Slurm call proves the lease first.
    fence = Fence(lease, on_fenced=lifetime.lease_lost)
    if lease is not None:
        slurm = FencedSlurm(slurm, fence)
    # [daemon] mode (b300.safety.mode): in observe mode nothing below acts of its own accord; what
    # it would have done is logged and recorded as action.withheld events.
    policy = action_policy(config)
    withheld = Withheld(store.append_events, policy.why)
    _log_mode(config, policy)
    drift = make_drift_watch(config.drift, store, slurm, lock, clock, plugins,
                             withheld=None if policy.nodes_and_runs else withheld)
    recovery_on = policy.nodes_and_runs
    recoverer: Recoverer | None = None

    def avoid() -> set[str]:
        """Nodes no new attempt may land on: open drift findings, black holes."""
        return _drifted_nodes(drift, store, slurm) | (recoverer.black_hole_nodes() if recoverer else set())

    # The daemon-held spare pools ([spares], b300.spares): refilled by the cycle, asked by
    # every resubmission. With no pool configured they ask Slurm once, at the first upkeep
    # (a pool an earlier config left is deleted), then nothing.
    # Which runs keep a pool's surplus and which nodes are promised: read from the store by
    # the pools (b300.spares.pools.waiting_runs). The user is resolved now: a UID with no
    # passwd entry is a one-line config error at start-up, not a KeyError every refill.
    # [spares] is live (SIGHUP): a pool added by a reload is made at the next upkeep, one
    # dropped has its reservation deleted (b300.spares.pools.SparePools.upkeep).
    pools_on = policy.reservations
    spares = SparePools(store, slurm, clock, lambda: current.get().spares, avoid=avoid,
                        user=pool_user(config.spares) if pools_on else "")
    actions = RunActions(store, slurm, clock, submit_grace_s=config.submit_grace_s,
                         job_log_dir=config.job_log_dir,
                         avoid_nodes=lambda: _drifted_nodes(drift, store, slurm),
                         black_holes=lambda: recoverer.black_hole_nodes() if recoverer else set(),
                         plugins=plugins, spares=spares.placement,
                         on_placed=spares.placed)
    scheduler = BackgroundScheduler(timezone=UTC)
    cycles_box: list[CycleRunner] = []

    def wake() -> None:
        """Run a cycle soon (a node-down trigger, a dead node, a change made through the socket)."""
        for runner in cycles_box:
            runner.wake()
        try:
            scheduler.modify_job("poll", next_run_time=datetime.now(UTC))
        except Exception:  # the scheduler may be starting or shutting down
            log.debug("wake.skipped")

    node_loss = _node_loss_watch(config, store, slurm, lock, clock, wake, plugins,
                                 act=recovery_on, withheld=withheld)
    if recovery_on:
        recoverer = Recoverer(store, slurm, actions, clock, config.recovery,
                              job_log_dir=config.job_log_dir,
                              node_health=node_loss.node_health if node_loss else None,
                              detect_window_s=_detect_window_s(config), plugins=plugins,
                              training=config.training)
    tracker = AttemptTracker(store, clock, accounting_grace_s=config.accounting_grace_s,
                             recovering=recovery_on, withheld=withheld)
    # Training health (b300.training.health_step): progress read and judged each cycle, whether
    # or not recovery is on (a finding is an event, a metric and an alert); with recovery on,
    # [training] straggler_action = "drain" also drains a straggler (b300.recovery.straggler_drain).
    training = TrainingWatch(store, clock, lambda: current.get().training, state_dir=config.state_dir,
                             output_path=lambda a, s: job_log_path(a, s, current.get().job_log_dir),
                             drainer=StragglerDrainer(store, slurm, clock) if recovery_on else None)
    hangs = HangWatch(store, slurm, clock, progress=training.progress_step,
                      withheld=None if recovery_on else withheld)
    # Node triage ([triage], b300.triage): off by default; acts only as recovery does. A
    # passed node refills a short spare pool of its partition first.
    triage = NodeTriage(store, slurm, clock, lambda: current.get().triage, job_log_dir=config.job_log_dir,
                        act=recovery_on, withheld=withheld, pools=spares if policy.reservations else None)
    cycle = PollCycle(store=store, slurm=slurm, actions=actions,
                      observer=ClusterObserver(slurm, store), tracker=tracker, clock=clock,
                      recoverer=recoverer, hangs=hangs, training=training,
                      spares=spares if policy.reservations else None,
                      requeues=RequeueReconciler(store, slurm, actions, clock, config.recovery.settle_s)
                      if recovery_on else None,
                      triage=triage.upkeep,
                      elastic=ReportedDeaths(store, slurm, clock, log_dir=config.job_log_dir).reconcile
                      if recovery_on else None)
    health = CycleHealth()
    cycles = CycleRunner(cycle, lifetime, lock, current.get, health)
    cycles_box.append(cycles)

    operations = Operations(config=current.get, store=store, clock=clock, fence=fence.check,
                            health=health, accounting=lambda: tracker.accounting,
                            running=lambda: bool(scheduler.running) and not lifetime.stopping(),
                            training=training.figures)
    upkeep = CheckpointUpkeep(store, store.checkpoints, _checkpoints_for(config, policy), clock,
                              action_lock=lock, plugins=plugins, stopping=lifetime.stopping,
                              fence=fence.check,
                              withheld=lambda *a, **k: withheld(*a, why=_prune_why(config, policy), **k))
    drills = DrillWatch(store, slurm, config=current.get, lock=lock, clock=clock, fence=fence.check,
                        plugins=plugins, wake=wake)
    router = ControlRouter(config=current.get, store=store, slurm=slurm, actions=actions, drift=drift,
                           upkeep=upkeep, fence=fence, lock=lock, clock=clock, role=lifetime.role,
                           ping=lifetime.ping, active_holder=lifetime.active_holder, wake=wake,
                           drills=drills)
    server_group: list[Callable[[str], None]] = []

    def apply(old: Config, change: ConfigChange) -> None:
        new = change.config
        with lock:
            current.config = new
            if recoverer is not None and {"recovery", "training"} & set(change.applied):
                recoverer.reconfigure(new.recovery, new.training)
        if "log_level" in change.applied or "log_format" in change.applied:
            configure_logging(new.log_format, new.log_level)
        if "poll_interval_s" in change.applied:
            timed.place(scheduler, {"poll": timed.Every(cycles.run, new.poll_interval_s)})
        if "admin_group" in change.applied:
            for set_group in server_group:
                set_group(new.admin_group)
        operations.reconfigure(old, new)

    def on_start() -> None:
        if recovery_on and config.recovery.node_trigger:
            arm_node_trigger(slurm, trigger_program(config), config.socket)
        _check_checkpoint_dirs(store, config)

    parts = DaemonParts(
        config=config, store=store, slurm=slurm, lifetime=lifetime, lock=lock, clock=clock,
        scheduler=scheduler, cycles=cycles,
        checkpoint_pass=CheckpointPass(
            store, store.checkpoints, slurm, clock, plugins=plugins,
            allow_signals=config.checkpoints.allow_signals and policy.signals,
            signals_held_back="" if config.mode == ACT else policy.why,
            signal_grace_s=config.checkpoints.signal_grace_s,
            manifests_per_pass=config.checkpoints.manifests_per_pass),
        checkpoint_upkeep=upkeep,
        drift=drift, operations=operations, router=router, node_loss=node_loss,
        reloader=ConfigReloader(config.path, current.get, apply, store, clock),
        on_start=on_start, drills=drills)
    daemon = Daemon(parts)
    server_group.append(daemon.set_admin_group)
    return daemon


def _log_mode(config: Config, policy: ActionPolicy) -> None:
    """One start-up line saying whether the daemon will act, and on what."""
    if config.mode != ACT:
        log.warning("mode.observe", why=policy.why if config.mode_set else
                    '[daemon] mode is not set: the default is "observe"; a daemon upgraded from a '
                    'release that acted needs mode = "act" to go on acting',
                    meaning="records, alerts and reports; drains, cancels, signals, resubmits and "
                            "deletes nothing of its own accord (b300ctl commands are carried out)")
        return
    log.info("mode.act", nodes_and_runs=policy.nodes_and_runs, signals=policy.signals,
             deletes=policy.deletes, reservations=policy.reservations)


def _checkpoints_for(config: Config, policy: ActionPolicy) -> CheckpointsConfig:
    """[checkpoints] as upkeep may act on it: nothing deleted unless the daemon acts."""
    if policy.deletes:
        return config.checkpoints
    return dataclasses.replace(config.checkpoints, prune=False, prune_remote=False)


def _prune_why(config: Config, policy: ActionPolicy) -> str:
    if config.mode != ACT:
        return policy.why
    return "[checkpoints] prune = false (plan only)"


def _node_loss_watch(config: Config, store: Store, slurm: SlurmClient, lock: threading.Lock,
                     clock: Callable[[], datetime], wake: Callable[[], None],
                     plugins: PluginRegistry, *, act: bool, withheld: Withheld) -> NodeLossWatch | None:
    """Active failure detection, when ``[liveness]`` is on: the primary and confirmation
    checks of its config (b300.liveness.probes), each falling back to the slurmd connect
    where it cannot run here (one line says why). With ``act`` off, dead nodes are
    recorded and the actions withheld."""
    cfg = config.liveness
    if not cfg.enabled:
        return None
    from ..liveness.probes import ProbeConfirmer, choose, prober
    from ..liveness.rounds import LivenessMonitor

    ssh_ready = config.drift is not None and bool(config.drift.endpoints())
    chosen = choose(cfg, ssh_ready=ssh_ready)
    for note in chosen.notes:
        log.warning("liveness.probe_unavailable", note=note)
    if not chosen.confirm:
        return None
    primary = prober(chosen.primary, cfg, cfg.timeout_s)
    confirmer: Confirmer
    if chosen.confirm == "ssh":
        from ..liveness.confirm import SshConfirmer, confirm_runner

        assert config.drift is not None
        confirmer = SshConfirmer(confirm_runner(config.drift.ssh, config.drift.endpoints(), cfg))
    else:
        # A lost packet is a failed confirmation: the check's own timeout is its whole budget.
        confirmer = ProbeConfirmer(prober(chosen.confirm, cfg, cfg.confirm_timeout_s * 0.9),
                                   lambda node: monitor.target(node), cfg.confirm_timeout_s, chosen.confirm)
    monitor = LivenessMonitor(cfg, primary, confirmer)
    log.info("liveness.on", primary=chosen.primary, confirm=chosen.confirm, interval_s=cfg.interval_s,
             misses_to_suspect=cfg.misses_to_suspect, confirm_window_s=cfg.confirm_window_s,
             acting=act)
    # Runs with spare_nodes get a new step in the same job instead (b300.recovery.relaunch).
    relauncher = StepRelauncher(store, clock, log_dir=config.job_log_dir, plugins=plugins)
    return NodeLossWatch(store, slurm, monitor, lock=lock, clock=clock, wake=wake,
                         settle_s=config.recovery.settle_s, relauncher=relauncher, act=act,
                         withheld=withheld)


def _detect_window_s(config: Config) -> float:
    """How long the liveness checks need to see a node that died: N missed rounds, the
    confirmation window, and a round for the confirmation itself."""
    cfg = config.liveness
    return cfg.misses_to_suspect * cfg.interval_s + cfg.confirm_window_s + cfg.confirm_timeout_s


def _drifted_nodes(drift: DriftWatch | None, store: Store, slurm: SlurmClient) -> set[str]:
    """Nodes with open drift findings (drain policy): no attempt may land there.

    Only Slurm's own nodes: a finding for a host that is not one (a typo in
    [drift.nodes], a retired node) is reported, never put in an exclude list,
    where sbatch would refuse the whole job ("Invalid node name")."""
    if drift is None:
        return set()
    drifted = store.drift.open_drift_nodes()
    if not drifted:
        return set()
    known = {n.name for n in store.list_nodes()}
    if not known:
        try:
            known = {n.name for n in slurm.nodes()}
        except SlurmError:
            known = set()
    outside = drifted - known
    if outside:
        log.warning("drift.not_a_slurm_node", nodes=sorted(outside),
                    action="reported, not excluded (sbatch would refuse the job)")
    return drifted & known


def _check_checkpoint_dirs(store: Store, config: Config) -> None:
    """At start: one line per active run whose checkpoint folder this daemon cannot
    write (a folder left out of the unit's ReadWritePaths, a read-only mount)."""
    try:
        runs = [r for r in store.list_runs() if not r.state.is_terminal]
    except StoreError as exc:
        log.warning("checkpoint.access_unchecked", error=str(exc))
        return
    for run in runs:
        try:
            spec = spec_of(run)
        except B300Error:
            continue
        if spec.checkpoint.dir and (why := checkpoint_dir_problem(spec.checkpoint.dir,
                                                                  config.checkpoints.roots)):
            log.error("checkpoint.not_writable", run=run.id, why=why)
