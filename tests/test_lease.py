"""The lease row (b300.ha.lease) on SQLite and PostgreSQL: takeover by time, epochs, fencing,
and a client-side deadline that holds when the path to PostgreSQL stops forwarding."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy.engine import make_url

from b300.errors import StoreError
from b300.ha.lease import DbLease, FencedError
from b300.store import create_engine, open_store
from helpers import CuttableProxy, wait_for
from store_fixtures import store_url_fixture  # noqa: F401 - a fixture, used by name


def _lease(url: str, ident: str, ttl: float = 1.0) -> DbLease:
    return DbLease(create_engine(url, statement_timeout_s=1.0, lock_timeout_s=0.5,
                                 connect_timeout_s=2, pool_size=1),
                   "t", ttl_s=ttl, call_timeout_s=1.0, identity=ident)


def test_takeover_only_after_expiry_with_a_new_epoch(store_url: str) -> None:
    open_store(store_url).close()  # migrated
    a, b = _lease(store_url, "a"), _lease(store_url, "b")
    try:
        assert a.try_acquire() and a.epoch == 1 and a.healthy()
        assert not b.try_acquire()
        assert b.previous is not None and b.previous.holder == "a"
        a.prove("sbatch x")  # held: proven (and renewed)
        # a stops renewing (frozen); b gets it once expires_at passes by the database's clock
        wait_for(b.try_acquire, 10, "b to take over the expired lease", every=0.05)
        assert b.epoch == 2 and b.previous is not None and b.previous.epoch == 1
        with pytest.raises(FencedError, match="taken over"):
            a.prove("sbatch y")
        assert a.lost and not a.healthy()
        assert not a.try_acquire()  # a fenced daemon never holds the lease again
        info = b.read()
        assert info is not None and info.holder == "b" and info.epoch == 2 and info.live
    finally:
        a.release()
        b.release()


def test_release_hands_over_at_once(store_url: str) -> None:
    open_store(store_url).close()
    a, b = _lease(store_url, "a", ttl=60), _lease(store_url, "b", ttl=60)
    try:
        assert a.try_acquire()
        assert not b.try_acquire()
        a.release()
        assert b.try_acquire() and b.epoch == 2
    finally:
        b.release()


def test_a_standby_cannot_prove_anything(store_url: str) -> None:
    open_store(store_url).close()
    a = _lease(store_url, "a")
    with pytest.raises(FencedError, match="not the active daemon"):
        a.prove("scancel 1")
    a.release()


@pytest.mark.postgres
def test_renewal_through_a_cut_path_fails_within_its_deadline(pg_url: str) -> None:
    """A proxy that stops forwarding with the sockets left open: the renewal ends
    by the client-side deadline, not after TCP's hours, and the proof fails."""
    open_store(pg_url).close()
    url = make_url(pg_url)
    proxy = CuttableProxy((url.host or "127.0.0.1", url.port or 5432))
    lease = _lease(url.set(port=proxy.port).render_as_string(hide_password=False), "cut", ttl=30)
    try:
        assert lease.try_acquire()
        proxy.cut()
        started = time.monotonic()
        with pytest.raises(StoreError, match="no answer within"):
            lease.renew()
        assert time.monotonic() - started < 3.0
        # Still inside its validity it may not act without a proof either.
        with pytest.raises(FencedError, match="cannot prove"):
            lease.prove("sbatch z")
    finally:
        proxy.close()
        threading.Thread(target=lease.release, daemon=True).start()


@pytest.mark.postgres
@pytest.mark.parametrize("end", ["commit", "rollback on return to the pool"])
def test_a_transaction_end_through_a_cut_path_fails_within_its_deadline(pg_url: str, end: str) -> None:
    """COMMIT and ROLLBACK are sent by the driver, not through a cursor: through a path
    that stopped forwarding they blocked until the path closed (a daemon that had lost
    its lease hung 90 s in one). Under the deadline they fail like a statement."""
    import sqlalchemy as sa

    open_store(pg_url).close()
    url = make_url(pg_url)
    proxy = CuttableProxy((url.host or "127.0.0.1", url.port or 5432))
    engine = create_engine(url.set(port=proxy.port).render_as_string(hide_password=False),
                           statement_timeout_s=1.0, connect_timeout_s=2, pool_size=1)
    outcome: list[BaseException | None] = []

    def transaction() -> None:
        conn = engine.connect()
        try:
            conn.execute(sa.text("SELECT 1"))
            proxy.cut()
            if end == "commit":
                conn.commit()
            conn.close()  # returns it to the pool, which rolls back what is open
        except Exception as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    try:
        started = time.monotonic()
        worker = threading.Thread(target=transaction, daemon=True)
        worker.start()
        worker.join(15)
        assert not worker.is_alive(), f"{end} still blocked after 15 s"
        assert time.monotonic() - started < 6.0  # the 1 s statement timeout + 2 s deadline
        assert outcome and isinstance(outcome[0], sa.exc.OperationalError), outcome
    finally:
        proxy.close()
        engine.dispose()
