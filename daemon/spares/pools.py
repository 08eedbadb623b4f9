"""The spare pools on the Slurm side: refilled each ``refill_interval_s`` (from the poll
cycle, under the action lock), asked by a resubmission for a placement, and recorded.

The pool is Slurm state: the reservation is found by its name at every upkeep, so a
restarted (or failed-over) daemon adopts it as it is. Every change of a pool (and the
first look after a start) is a ``spares.pool`` event, which ``b300ctl nodes`` and the
``b300_spare_pool_nodes`` metric read.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Collection
from datetime import datetime

import structlog

from ..errors import B300Error, ConfigError, SlurmError
from ..events import Kind
from ..interfaces import NewEvent, SlurmClient, Store
from ..model import AttemptState
from ..spec import JobSpec, spec_of
from .pool import (
    NO_HOLD,
    Placement,
    PoolPlan,
    PoolView,
    Reservation,
    Waiting,
    healthy_idle,
    keep_surplus,
    lacks_no_hold,
    node_states,
    parse_reservations,
    place,
    pool_to_refill,
    pooled_reservation,
    promised,
    refill,
)
from .pool_config import PREFIX, PoolTable, SparesConfig, reservation_name

log = structlog.get_logger(__name__)

#: How long the cluster's default partition, once asked, is taken as known.
DEFAULT_PARTITION_TTL_S = 300.0


def daemon_user() -> str:
    """The user b300d runs as: the one its jobs are submitted as."""
    return pwd.getpwuid(os.geteuid()).pw_name


def pool_user(cfg: SparesConfig) -> str:
    """The pools' ``Users=``: ``[spares] user``, else the user b300d runs as. Resolved once at
    start-up (:func:`b300.app.root.build_daemon`): a UID with no passwd entry (a container)
    is a config error, one line, instead of a KeyError in every refill."""
    if cfg.user:
        return cfg.user
    try:
        return daemon_user()
    except KeyError:
        raise ConfigError(f"[spares] user is empty and uid {os.geteuid()} has no passwd entry "
                          "to name the reservation's Users=; set [spares] user") from None


def waiting_runs(store: Store, default_partition: Callable[[], str | None] = lambda: None) -> list[Waiting]:
    """The daemon's runs that are not over, as the pools see them (:class:`Waiting`): the
    reservation is read from the latest attempt's events only while it has not started.
    A spec that names no partition runs in the cluster's default one: ``default_partition``
    (asked only if such a run exists)."""
    found: list[Waiting] = []
    runs = [r for r in store.list_runs() if not r.state.is_terminal]
    by_run = store.attempts_of([r.id for r in runs]) if runs else {}
    for run in runs:
        try:
            spec = spec_of(run)
        except B300Error:
            continue
        attempts = by_run.get(run.id, [])
        latest = attempts[-1] if attempts else None
        resv = None
        if latest is not None and latest.state in (AttemptState.SUBMITTING, AttemptState.PENDING):
            resv = pooled_reservation(
                (e.kind, e.data) for e in store.events(
                    run_id=run.id, kinds=[Kind.ATTEMPT_INTENT, Kind.SPARES_USED])
                if e.attempt_id == latest.id)
        found.append(Waiting(run.state, latest.state if latest else None,
                             spec.partition or default_partition(), resv,
                             spec.nodes + spec.spare_nodes, latest.id if latest else None))
    return found


class SparePools:
    """The daemon's spare pools (``[spares]``). Not thread-safe: callers hold the action lock."""

    def __init__(self, store: Store, slurm: SlurmClient, clock: Callable[[], datetime],
                 config: Callable[[], SparesConfig], *,
                 avoid: Callable[[], Collection[str]] = lambda: (),
                 user: str | None = None) -> None:
        # ``slurm``: a SlurmClient with the reservation calls (the cli client, or pyslurm's
        # fallback to it), fenced like every change. ``user``: :func:`pool_user`, resolved
        # at start-up (None: resolved here, now).
        self._store, self._slurm, self._clock, self._config = store, slurm, clock, config
        self._avoid = avoid
        self._user_name = user if user is not None else pool_user(config())
        self._last: dict[str, tuple[tuple[str, ...], tuple[str, ...], str | None]] = {}
        self._next_at = 0.0
        # Pools of an earlier config (a reload dropped them, or [spares] was turned off):
        # their reservations are deleted at the next upkeeps, until Slurm lets us.
        self._known: set[str] = {p.partition for p in config().pools}
        self._retiring: set[str] = set()
        # The first upkeep of the daemon's life also looks for pools an earlier config left
        # (``b300-spares-*`` of a partition the config has no pool for) and retires them:
        # one ``scontrol show reservation``, then none while no pool is configured.
        self._swept = False
        self._default: tuple[float, str | None] | None = None   # (asked at, name)

    # -- reads ------------------------------------------------------------

    def _reservations(self) -> dict[str, Reservation]:
        return {r.name: r for r in parse_reservations(self._slurm.reservation_list())}

    def _user(self, cfg: SparesConfig) -> str:
        if not cfg.user and not self._user_name:
            self._user_name = pool_user(cfg)   # [spares] turned on by a reload
        return cfg.user or self._user_name

    def _default_partition(self) -> str | None:
        """The cluster's default partition (a spec without ``partition`` runs there), asked
        again after :data:`DEFAULT_PARTITION_TTL_S` (an ``scontrol reconfigure`` may move it)."""
        now = self._clock().timestamp()
        if self._default is None or now - self._default[0] > DEFAULT_PARTITION_TTL_S:
            self._default = (now, self._slurm.default_partition())
        return self._default[1]

    def _waiting(self) -> list[Waiting]:
        return waiting_runs(self._store, self._default_partition)

    # -- refill -----------------------------------------------------------

    def upkeep(self, *, force: bool = False) -> list[PoolPlan]:
        """Refill every pool if ``refill_interval_s`` passed (or ``force``); the plans made."""
        cfg = self._config()
        current = {p.partition for p in cfg.pools}
        self._retiring = (self._retiring | (self._known - current)) - current
        self._known = current
        if not cfg.pools and not self._retiring and self._swept:
            return []
        now = self._clock().timestamp()
        if not force and now < self._next_at:
            return []
        self._next_at = now + cfg.refill_interval_s
        try:
            reservations = self._reservations()
        except SlurmError as exc:
            log.warning("spares.unknown", error=str(exc))
            self._swept = self._swept or not exc.transient   # e.g. pyslurm without the CLI
            return []
        if not self._swept:
            self._swept = True
            self._retiring |= {n[len(PREFIX):] for n in reservations if n.startswith(PREFIX)} - current
        self._retire(reservations)
        if not cfg.pools:
            return []
        try:
            states = node_states(self._slurm.nodes())
        except SlurmError as exc:
            log.warning("spares.unknown", error=str(exc))
            return []
        avoid = set(self._avoid())
        try:
            waiting = self._waiting()
        except B300Error as exc:
            log.warning("spares.runs_unknown", error=str(exc))
            return []
        plans = []
        for pool in cfg.pools:
            try:
                plans.append(self._refill(cfg, pool, reservations, states, avoid, waiting))
            except B300Error as exc:   # Slurm's refusal or outage; a user no passwd names
                log.warning("spares.refill_failed", partition=pool.partition, error=str(exc))
                self._record(pool, reservations.get(pool.reservation), None, error=str(exc)[:300])
        return plans

    def _retire(self, reservations: dict[str, Reservation]) -> None:
        """Delete the reservation of each pool the config no longer has (its nodes go back
        to the partition). Slurm refuses while a job of the daemon runs in it: it is tried
        again every interval until that job ends; a job pending in it goes to the queue
        (NO_HOLD_JOBS_AFTER_END)."""
        for partition in sorted(self._retiring):
            name = reservation_name(partition)
            gone = name not in reservations
            if not gone:
                try:
                    self._slurm.delete_reservation(name)
                    gone = True
                except SlurmError as exc:
                    log.info("spares.retire_refused", partition=partition, why=str(exc)[:200])
            if gone:
                self._retiring.discard(partition)
                self._last.pop(partition, None)
                log.info("spares.retired", partition=partition, reservation=name)
                self._store.append_events([NewEvent(Kind.SPARES_POOL, actor="spares", data={
                    "partition": partition, "reservation": name, "wanted": 0, "nodes": [],
                    "idle": [], "retired": True})], self._clock())

    def _refill(self, cfg: SparesConfig, pool: PoolTable, reservations: dict[str, Reservation],
                states: dict[str, str], avoid: set[str], waiting: list[Waiting]) -> PoolPlan:
        mine = reservations.get(pool.reservation)
        if mine is not None and lacks_no_hold(mine):
            # Adopted from an older daemon (made with no flag): without it, deleting the pool
            # would hold the jobs pending in it for ever.
            try:
                self._slurm.add_reservation_flag(pool.reservation, NO_HOLD)
                log.info("spares.flag_added", partition=pool.partition, flag=NO_HOLD)
            except SlurmError as exc:
                if exc.transient:
                    raise
                log.warning("spares.flag_refused", partition=pool.partition, flag=NO_HOLD,
                            error=str(exc)[:200])
        others = {n for r in reservations.values() if r.name != pool.reservation for n in r.nodes}
        plan = refill(wanted=pool.nodes, current=mine.nodes if mine else (),
                      partition_nodes=self._slurm.partition_nodes(pool.partition),
                      nodes_now=states, avoid=avoid, other_reserved=others,
                      keep_surplus=keep_surplus(waiting, pool.partition, pool.reservation),
                      promised=promised(waiting, pool.reservation))
        if plan.nodes is not None:
            if mine is None:
                if plan.nodes:
                    self._slurm.create_reservation(pool.reservation, plan.nodes,
                                                   users=self._user(cfg), partition=pool.partition)
            elif plan.nodes:
                self._slurm.update_reservation(pool.reservation, plan.nodes)
            else:
                try:   # Slurm refuses while a job runs in it: it then stays as it is
                    self._slurm.delete_reservation(pool.reservation)
                except SlurmError as exc:
                    if exc.transient:
                        raise
                    log.info("spares.kept", partition=pool.partition, why=str(exc)[:200])
            log.info("spares.refilled", partition=pool.partition, added=list(plan.added),
                     removed=list(plan.removed), idle=len(plan.idle), short=plan.short)
        self._record(pool, mine, plan)
        return plan

    def _record(self, pool: PoolTable, mine: Reservation | None, plan: PoolPlan | None,
                error: str | None = None) -> None:
        nodes = (plan.nodes if plan.nodes is not None else (mine.nodes if mine else ())) \
            if plan else (mine.nodes if mine else ())
        idle = plan.idle if plan else ()
        key = (tuple(nodes), tuple(idle), error)
        first = pool.partition not in self._last
        if not first and self._last[pool.partition] == key:
            return   # one record per change (a refusal repeated every interval is one)
        self._last[pool.partition] = key
        data: dict[str, object] = {
            "partition": pool.partition, "reservation": pool.reservation, "wanted": pool.nodes,
            "nodes": list(nodes), "idle": list(idle)}
        if plan is not None:
            data.update(held=list(plan.held), added=list(plan.added), removed=list(plan.removed),
                        short=plan.short)
        if first and mine is not None:
            data["adopted"] = True     # found in Slurm by name: a restart keeps the pool
        if error:
            data["error"] = error
        self._store.append_events([NewEvent(Kind.SPARES_POOL, actor="spares", data=data)],
                                  self._clock())

    # -- placement --------------------------------------------------------

    def placement(self, spec: JobSpec, excluded: Collection[str], *,
                  ignore: Collection[int] = ()) -> Placement | None:
        """Where a resubmitted attempt of ``spec`` goes: its partition's pool if that holds
        enough usable nodes now (read afresh), beyond those promised to attempts already
        placed there that have not started (read from the store: two runs recovered in one
        cycle do not get the same nodes), else None (a plain resubmission). ``ignore``:
        attempt ids not counted as promised (the attempt asking again)."""
        cfg = self._config()
        if not cfg.pools:
            return None
        try:
            pool = cfg.pool_for(spec.partition or self._default_partition())
            if pool is None:
                return None
            mine = self._reservations().get(pool.reservation)
            states = node_states(self._slurm.nodes())
            owed = promised(self._waiting(), pool.reservation, ignore=ignore)
        except B300Error as exc:
            log.warning("spares.placement_unknown", error=str(exc))
            return None
        found = place(reservation=mine, partition=pool.partition,
                      needed=spec.nodes + spec.spare_nodes, nodes_now=states,
                      excluded=set(excluded), avoid=set(self._avoid()), promised=owed)
        if found is None:
            log.info("spares.too_few", partition=pool.partition, needed=spec.nodes + spec.spare_nodes,
                     pool=list(mine.nodes) if mine else [], promised=owed)
        return found

    # -- a node back from triage ----------------------------------------

    def short_pool_for(self, node: str) -> str | None:
        """The reservation of the pool a node that passed triage goes to (a pool of its
        partition short of idle nodes: :func:`~b300.spares.pool.pool_to_refill`), or None."""
        cfg = self._config()
        if not cfg.pools:
            return None
        reservations = self._reservations()
        waiting = self._waiting()
        views = [PoolView(p.reservation, p.nodes, set(self._slurm.partition_nodes(p.partition)),
                          reservations[p.reservation].nodes if p.reservation in reservations else (),
                          promised(waiting, p.reservation)) for p in cfg.pools]
        return pool_to_refill(node, views, node_states(self._slurm.nodes()), set(self._avoid()))

    def take(self, reservation: str, node: str) -> None:
        """Add ``node`` (drained by the caller while it moves) to the pool ``reservation``
        (made if missing), recorded as a ``spares.pool`` change; nothing if it holds it."""
        cfg = self._config()
        pool = next((p for p in cfg.pools if p.reservation == reservation), None)
        if pool is None:
            raise SlurmError(f"no spare pool {reservation!r} in the config", transient=False)
        mine = self._reservations().get(reservation)
        if mine is not None and node in mine.nodes:
            return
        nodes = (*(mine.nodes if mine else ()), node)
        if mine is None:
            self._slurm.create_reservation(reservation, nodes, users=self._user(cfg), partition=pool.partition)
        else:
            self._slurm.update_reservation(reservation, nodes)
        log.info("spares.refilled", partition=pool.partition, added=[node], by="triage")
        states = node_states(self._slurm.nodes())
        idle = (*(n for n in nodes if n != node and healthy_idle(states.get(n))), node)
        self._record(pool, mine, PoolPlan(nodes, idle, (node,)))

    def placed(self) -> None:
        """A job went into a pool: refill at the next upkeep instead of waiting the interval."""
        self._next_at = 0.0
