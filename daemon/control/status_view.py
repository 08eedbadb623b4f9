"""What ``b300ctl status`` shows, as JSON-able data read from a store.

One builder for both ways b300ctl gets it: from the running daemon (control op
``status``, answered from the store the daemon has open, so that b300ctl imports
neither SQLAlchemy nor SQLModel: most of its start-up time), or, when no daemon
answers, from the store itself (:mod:`b300.cli.status`). Reads only; takes no lock.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..errors import B300Error, UsageError
from ..events import ACCOUNTING, Kind
from ..interfaces import Store
from ..model import Attempt, Run, attempt_to_dict, run_to_dict
from ..payloads import AccountingUnavailable

if TYPE_CHECKING:
    from ..checkpoints.advice import RunSchedule

#: Ended runs the list shows when none is active (and without ``all``).
ENDED_SHOWN = 20
#: Slurm's clock is not ours: attempts are looked for from a day before the oldest run.
_CLOCK_MARGIN = timedelta(days=1)


def status_view(store: Store, request: Mapping[str, Any], *, lease_name: str, state_dir: str,
                now: datetime) -> dict[str, Any]:
    """The answer to a status request: one run's detail for ``{"run": ID}``, else the list
    (``{"all": true}``: ended runs too). Raises NotFoundError for an unknown run and
    UsageError for a request that is not one."""
    run_id = request.get("run")
    if run_id is None:
        return run_list(store, include_ended=request.get("all") is True, lease_name=lease_name)
    if not isinstance(run_id, str):
        raise UsageError("status: run must be a run id")
    return run_detail(store, run_id, now=now, state_dir=state_dir)


def run_list(store: Store, *, include_ended: bool, lease_name: str) -> dict[str, Any]:
    """``runs`` (each with its ``current`` attempt), the HA ``lease`` row and the
    ``accounting_note``."""
    runs = store.list_runs()
    if not include_ended:
        runs = [r for r in runs if not r.state.is_terminal] or runs[:ENDED_SHOWN]
    current = _last_attempts(store, runs)
    rows = [{**run_to_dict(run), "current": attempt_to_dict(current[run.id]) if run.id in current else None}
            for run in runs]
    return {"runs": rows, "lease": store.daemon_lease(lease_name), "accounting_note": accounting_note(store)}


def run_detail(store: Store, run_id: str, *, now: datetime, state_dir: str) -> dict[str, Any]:
    """``run``, ``attempts`` (the last with its ``exclusions``), ``events``, ``slurm`` (the
    release b300d found at its last start), ``checkpoint_schedule`` and, for the text
    form, ``schedule_text`` and ``accounting_note``."""
    from ..slurm.release import read_release

    note = accounting_note(store)
    run = store.get_run(run_id)
    schedule = _schedule(store, run, now)
    stored = store.attempts(run_id)
    attempts = [attempt_to_dict(a) for a in stored]
    if attempts:
        attempts[-1]["exclusions"] = _exclusions(store, stored[-1])
    events = [{"id": e.id, "ts": e.ts.isoformat(), "kind": e.kind, "node": e.node, "actor": e.actor,
               "attempt_id": e.attempt_id, "data": e.data}
              for e in store.events(run_id=run_id)]
    return {"run": run_to_dict(run), "attempts": attempts, "events": events,
            "slurm": read_release(state_dir) if state_dir else None,
            "checkpoint_schedule": schedule.to_dict() if schedule else None,
            "schedule_text": schedule.lines() if schedule else [], "accounting_note": note}


def accounting_note(store: Store) -> str | None:
    """One line when the daemon's last word on Slurm accounting is that it is down."""
    last = store.events(kinds=list(ACCOUNTING))[-1:]
    if not last or last[0].kind != Kind.ACCOUNTING_UNAVAILABLE:
        return None
    error = AccountingUnavailable.of(last[0]).error
    return (f"note: Slurm accounting (sacct/slurmdbd) has not answered since "
            f"{last[0].ts:%Y-%m-%d %H:%M:%S}Z ({error}); a job that ends meanwhile gets its exit "
            f"code once it answers, or none after [slurm] accounting_grace")


def _last_attempts(store: Store, runs: list[Run]) -> dict[str, Attempt]:
    """Each run's newest attempt, in one query instead of one per run.

    Every attempt of a run ends after the run was created, so the attempts that
    ended since the oldest run's creation (less a margin) hold them all; a run
    still missing one (a clock further off) is asked for on its own."""
    if not runs:
        return {}
    shown = {r.id for r in runs}
    last: dict[str, Attempt] = {}
    for a in store.attempts_since(min(r.created_at for r in runs) - _CLOCK_MARGIN):
        if a.run_id in shown and (a.run_id not in last or a.number > last[a.run_id].number):
            last[a.run_id] = a
    for run in runs:
        if run.attempts_count and (run.id not in last or last[run.id].number < run.attempts_count):
            attempts = store.attempts(run.id)
            if attempts:
                last[run.id] = attempts[-1]
    return last


def _schedule(store: Store, run: Run, now: datetime) -> RunSchedule | None:
    from ..checkpoints.advice import stored_run_schedule
    from ..spec import parse_spec

    try:
        spec = parse_spec(run.spec_toml, where=f"run {run.id}")
    except B300Error:
        return None
    return stored_run_schedule(store, run, spec, now)


def _exclusions(store: Store, attempt: Attempt) -> list[dict[str, str]]:
    """The attempt's exclusions, each with its cause and whether that still holds now."""
    from ..cycle.run_actions import attempt_exclusions
    from ..recovery.exclusions import holds

    found = attempt_exclusions(store, attempt)
    if not found:
        return []
    drift = store.drift.open_drift_nodes()
    nodes_now = {n.name: n for n in store.list_nodes()}
    out = []
    for ex in found:
        why = holds(ex, nodes_now, drift, ())
        out.append({**ex.to_dict(), "now": f"holds: {why}" if why else "ended: healthy again"})
    return out
