"""``b300d --check-config``: every start-up check, acting on nothing (the pure part).

The checks themselves (files, Slurm, the database, SSH, SMTP, offsite targets) are
in :mod:`b300.app.preflight_checks`; this module holds what they report
(:class:`Check`), the verdicts that need no I/O, the one-line rendering and
:func:`run_checks`, which runs every check at once, each within its own time
budget, and returns their lines in a fixed order.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass


class Status(enum.StrEnum):
    OK = "ok"
    FAIL = "FAIL"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Check:
    """One line of the report: what was checked, how it went, and on failure what to do."""

    status: Status
    what: str
    fix: str = ""

    def line(self) -> str:
        """``ok   what``; ``FAIL what: fix``; one line whatever the texts hold."""
        text = self.what + (f" -- {self.fix}" if self.fix else "")
        return f"{self.status.value:<4} {' '.join(text.split())}"


def ok(what: str) -> Check:
    return Check(Status.OK, what)


def fail(what: str, fix: str) -> Check:
    return Check(Status.FAIL, what, fix)


def skip(what: str) -> Check:
    return Check(Status.SKIP, what)


def exit_code(checks: Sequence[Check]) -> int:
    """0 when nothing failed (skipped checks pass), else 1."""
    return 1 if any(c.status is Status.FAIL for c in checks) else 0


#: A check: returns its lines (several for a group such as Slurm's tools, release and
#: controller, where each needs the one before), raising nothing it can name itself.
CheckFn = Callable[[], list[Check]]


def run_checks(checks: Sequence[tuple[str, float, CheckFn]]) -> list[Check]:
    """Run every ``(name, budget_s, fn)`` at once, each in its own thread; a check that
    has not returned within its budget (counted from the start) is a FAIL naming it,
    and one that raised is a FAIL with the exception. The lines come in the given order.

    Threads are daemon threads: one stuck past its budget (a hung NFS mount, a silent
    host) cannot keep the process from exiting.
    """
    results: list[list[Check] | None] = [None] * len(checks)

    def call(i: int, name: str, fn: CheckFn) -> None:
        try:
            results[i] = fn()
        except Exception as exc:
            results[i] = [fail(f"{name}: {type(exc).__name__}: {str(exc)[:300]}",
                               "this is a fault of the check; report it with the line above")]

    threads = []
    for i, (name, _budget, fn) in enumerate(checks):
        t = threading.Thread(target=call, args=(i, name, fn), name=f"check-{name}", daemon=True)
        t.start()
        threads.append(t)
    start = time.monotonic()
    lines: list[Check] = []
    for i, (t, (name, budget, _fn)) in enumerate(zip(threads, checks, strict=True)):
        t.join(max(0.0, start + budget - time.monotonic()))
        got = results[i]
        if got is None:
            lines.append(fail(f"{name}: no answer within {budget:.0f} s",
                              "the service it talks to hangs; see the other lines and that service"))
        else:
            lines.extend(got)
    return lines


# -- verdicts (pure) -------------------------------------------------------------


def migration_check(where: str, current: Collection[str], heads: Collection[str],
                    known: Collection[str]) -> Check:
    """The database's revisions (``current``) against this code's ``heads`` and every
    revision it knows (``known``): at head; behind ("would migrate from X to Y", which
    b300d does at start: a pass); or ahead, a revision this code lacks (FAIL)."""
    cur, head = sorted(current), sorted(heads)
    want = ",".join(head)
    if set(cur) == set(head):
        return ok(f"database {where}: schema at head {want}")
    unknown = [r for r in cur if r not in known]
    if unknown:
        return fail(f"database {where}: schema revision {','.join(unknown)} is newer than this b300 "
                    f"(its head is {want})", "the database was migrated by a newer b300: upgrade this one")
    have = ",".join(cur) if cur else "an empty database"
    return ok(f"database {where}: would migrate from {have} to {want} at start")


def parse_slurm_user(show_config: str) -> str | None:
    """``SlurmUser`` from ``scontrol show config`` (``SlurmUser = slurm(64030)``), or None."""
    for line in show_config.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "SlurmUser":
            name = value.strip().split("(")[0].strip()
            return name or None
    return None


def trigger_check(user: str, uid: int, slurm_user: str | None) -> Check:
    """Whether ``user`` may arm the node-down strigger: slurmctld lets root and SlurmUser."""
    what = "node-down trigger ([recovery] node_trigger)"
    if uid == 0:
        return ok(f"{what}: running as root, may arm it")
    if slurm_user is None:
        return fail(f"{what}: SlurmUser unknown (scontrol show config did not name it)",
                    "check scontrol works for this user, or set [recovery] node_trigger = false")
    if user == slurm_user:
        return ok(f"{what}: {user} is SlurmUser, may arm it")
    who = "root" if slurm_user == "root" else f"{slurm_user} or root"
    return fail(f"{what}: {user} is neither root nor SlurmUser ({slurm_user}): strigger --set "
                "would be refused", f"run b300d as {who}, or set [recovery] node_trigger = false "
                "(the daemon then finds down nodes by polling alone)")


def backend_reason(configured: str, pyslurm_why_not: str | None) -> tuple[str, str]:
    """The Slurm backend b300d would use and why, as :func:`b300.slurm.make_slurm_client`
    decides: ``(backend, why)``. ``pyslurm_why_not``: None when pyslurm is usable."""
    if configured not in ("auto", "pyslurm"):
        return configured, "configured"
    if pyslurm_why_not is None:
        return "pyslurm", "pyslurm is built for the Slurm release the controller runs"
    return ("pyslurm" if configured == "pyslurm" else "cli"), pyslurm_why_not


def listing_root(option: str) -> str:
    """The folder a target path option lists for every run: the part before ``{run}``
    (``/mnt/offsite/{run}`` -> ``/mnt/offsite``)."""
    head = option.split("{run}", 1)[0]
    root = head if head.endswith("/") else head.rsplit("/", 1)[0]
    return root.rstrip("/") or "/"
