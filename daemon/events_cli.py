"""``b300ctl events``: the event log, filtered, optionally followed (``--follow``)."""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import Any

from .config import Config
from .errors import UsageError
from .interfaces import Store
from .model import Event

_RELATIVE = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)")
_UNIT_S = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
FOLLOW_INTERVAL_S = 1.0


def parse_when(text: str, now: datetime, what: str = "--since") -> datetime:
    """A time from ``2026-11-23``, ``2026-11-23T08:00[+01:00]`` (UTC if no offset) or ``2h``/``7d`` ago."""
    if m := _RELATIVE.fullmatch(text.strip()):
        return now - timedelta(seconds=float(m.group(1)) * _UNIT_S[m.group(2)])
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"{what}: {text!r} is not a date (2026-11-23, 2026-11-23T08:00) "
                         "or an age (2h, 7d)") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def add_events_command(add: Callable[..., argparse.ArgumentParser]) -> None:
    p = add("events", help="the event log (who did what, and what the daemon saw)")
    p.add_argument("--run", help="only this run's events")
    p.add_argument("--kind", action="append", metavar="KIND",
                   help="only this kind (e.g. node.drained); a trailing '.' means a prefix; repeatable")
    p.add_argument("--node", help="only this node's events")
    p.add_argument("--since", metavar="WHEN", help="from this time on (date, ISO time, or 2h/7d ago)")
    p.add_argument("--limit", type=int, default=200, metavar="N", help="show the last N (200)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new events until Ctrl-C")


def event_to_dict(e: Event) -> dict[str, Any]:
    return {"id": e.id, "ts": e.ts.isoformat(), "kind": e.kind, "run_id": e.run_id,
            "attempt_id": e.attempt_id, "node": e.node, "actor": e.actor, "data": e.data,
            "daemon": e.daemon}


def _matches(kinds: list[str] | None, kind: str) -> bool:
    return kinds is None or any(kind == k or (k.endswith(".") and kind.startswith(k)) for k in kinds)


def _fetch(store: Store, args: argparse.Namespace, after_id: int, since: datetime | None) -> list[Event]:
    exact = None if args.kind is None or any(k.endswith(".") for k in args.kind) else list(args.kind)
    found = store.events(run_id=args.run, node=args.node, kinds=exact, since=since, after_id=after_id)
    return [e for e in found if _matches(args.kind, e.kind)]


def _print(events: list[Event], as_json: bool) -> None:
    for e in events:
        if as_json:
            print(json.dumps(event_to_dict(e)), flush=True)
            continue
        detail = " ".join(f"{k}={v}" for k, v in e.data.items() if v not in (None, "", []))
        print(f"{e.ts:%Y-%m-%d %H:%M:%S}  {e.kind:<24} {e.run_id or '-':<14} {e.node or '-':<10} "
              f"{e.actor:<10} {detail}"[:400].rstrip(), flush=True)


def run_events(cfg: Config, args: argparse.Namespace, open_store: Callable[[Config], Store]) -> int:
    if args.limit < 1:
        raise UsageError("--limit must be at least 1")
    since = parse_when(args.since, datetime.now(UTC)) if args.since else None
    store = open_store(cfg)
    try:
        events = _fetch(store, args, 0, since)[-args.limit:]
        if args.json and not args.follow:
            print(json.dumps([event_to_dict(e) for e in events], indent=2))
            return 0
        _print(events, args.json)  # with --follow, --json prints one object per line
        if args.follow:
            _follow(store, args, events[-1].id if events else _last_id(store), since)
    finally:
        store.close()
    return 0


def _last_id(store: Store) -> int:
    # The newest id, paging through the log (only when nothing matched the filters).
    newest = 0
    while page := store.events(after_id=newest, limit=5000):
        newest = page[-1].id
    return newest


def _follow(store: Store, args: argparse.Namespace, after_id: int, since: datetime | None) -> None:
    """Poll the store every second; SIGINT or SIGTERM ends it (exit 0)."""
    stop = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    old = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(FOLLOW_INTERVAL_S):
            new = _fetch(store, args, after_id, since)
            if new:
                after_id = new[-1].id
                _print(new, args.json)
    except BrokenPipeError:  # `b300ctl events -f | head`
        sys.stderr.close()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
