"""``b300ctl events``: the event log, filtered, optionally followed (``--follow``).

Also :func:`parse_when`, the one grammar for times a person types on the command
line (``--since``/``--until`` of ``events`` and ``report``).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..grammar.duration import DurationError, duration_seconds
from .command import Command, Context, arg
from .output import details, print_json

if TYPE_CHECKING:
    from ..interfaces import Store
    from ..model import Event

FOLLOW_INTERVAL_S = 1.0
_LINE_MAX = 400
_PAGE = 5000


def parse_when(text: str, now: datetime, what: str = "--since") -> datetime:
    """A time from ``2026-11-23``, ``2026-11-23T08:00[+01:00]`` (UTC if no offset), or an age
    in the project's one duration grammar (:mod:`b300.grammar.duration`: ``2h``, ``90 min``,
    ``7d``, ``1w``; a bare number is seconds) before ``now``."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        try:
            return now - timedelta(seconds=duration_seconds(text))
        except (DurationError, OverflowError):
            raise UsageError(f"{what}: {text!r} is not a date (2026-11-23, 2026-11-23T08:00) "
                             "or an age (2h, 7d)") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def event_to_dict(e: Event) -> dict[str, Any]:
    """An event as ``b300ctl events --json`` prints it."""
    return {"id": e.id, "ts": e.ts.isoformat(), "kind": e.kind, "run_id": e.run_id,
            "attempt_id": e.attempt_id, "node": e.node, "actor": e.actor, "data": e.data,
            "daemon": e.daemon}


def run_events(ctx: Context, args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise UsageError("--limit must be at least 1")
    since = parse_when(args.since, ctx.clock()) if args.since else None
    store = ctx.open_store()
    try:
        if not args.follow:
            events = _fetch(store, args, 0, since)[-args.limit:]
            if ctx.json:
                print_json([event_to_dict(e) for e in events])
            else:
                _print(events, as_json=False)
            return 0
        # Ctrl-C or SIGTERM ends a follow (exit 0) from its very start: a signal that
        # came while the first events print must not kill it.
        with _stop_on_signals() as stop:
            events = _fetch(store, args, 0, since)[-args.limit:]
            _print(events, ctx.json)  # --json: one object per line
            _follow(store, args, ctx.json, events[-1].id if events else _last_id(store), since, stop)
    finally:
        store.close()
    return 0


def _matches(kinds: list[str] | None, kind: str) -> bool:
    return kinds is None or any(kind == k or (k.endswith(".") and kind.startswith(k)) for k in kinds)


def _fetch(store: Store, args: argparse.Namespace, after_id: int, since: datetime | None) -> list[Event]:
    exact = None if args.kind is None or any(k.endswith(".") for k in args.kind) else list(args.kind)
    found = store.events(run_id=args.run, node=args.node, kinds=exact, since=since, after_id=after_id)
    return [e for e in found if _matches(args.kind, e.kind)]


def _print(events: list[Event], as_json: bool) -> None:
    for e in events:
        if as_json:
            print_json(event_to_dict(e), lines=True)
            continue
        print(f"{e.ts:%Y-%m-%d %H:%M:%S}  {e.kind:<24} {e.run_id or '-':<14} {e.node or '-':<10} "
              f"{e.actor:<10} {details(e.data)}"[:_LINE_MAX].rstrip(), flush=True)


def _last_id(store: Store) -> int:
    # The newest id, paging through the log (only when nothing matched the filters).
    newest = 0
    while page := store.events(after_id=newest, limit=_PAGE):
        newest = page[-1].id
    return newest


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGINT or SIGTERM while the block runs (their handlers restored after)."""
    stop = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    old = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _follow(store: Store, args: argparse.Namespace, as_json: bool, after_id: int,
            since: datetime | None, stop: threading.Event) -> None:
    """Poll the store every second until ``stop`` is set; a reader that leaves
    (``b300ctl events -f | head``) ends it too, through main's BrokenPipe policy."""
    while not stop.wait(FOLLOW_INTERVAL_S):
        new = _fetch(store, args, after_id, since)
        if new:
            after_id = new[-1].id
            _print(new, as_json)


COMMANDS = (
    Command("events", "the event log (who did what, and what the daemon saw)", run_events, arguments=(
        arg("--run", help="only this run's events"),
        arg("--kind", action="append", metavar="KIND",
            help="only this kind (e.g. node.drained); a trailing '.' means a prefix; repeatable"),
        arg("--node", help="only this node's events"),
        arg("--since", metavar="WHEN", help="from this time on (date, ISO time, or 2h/7d ago)"),
        arg("--limit", type=int, default=200, metavar="N", help="show the last N (200)"),
        arg("--follow", "-f", action="store_true", help="keep printing new events until Ctrl-C"),
    )),
)
