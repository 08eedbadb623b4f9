"""The TCP prober against real sockets on loopback: answers, resets, silence, its own limits."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from b300.liveness.tcp import TcpProber
from b300.liveness.verdicts import CheckOutcome, Target


@pytest.fixture
def listening() -> Iterator[int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(4096)  # never accepted: the kernel alone completes the handshakes
    yield s.getsockname()[1]
    s.close()


@pytest.fixture
def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # bound, never listened: the kernel answers a SYN with a reset
    return int(port)


@pytest.fixture
def silent() -> Iterator[int]:
    """A port whose accept queue is full: the kernel drops every new SYN (a dead host's silence)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(0)
    port = s.getsockname()[1]
    fillers = []
    for _ in range(3):
        f = socket.socket()
        f.setblocking(False)
        f.connect_ex(("127.0.0.1", port))
        fillers.append(f)
    time.sleep(0.2)  # the handshakes of the fillers are the kernel's, done in microseconds
    yield port
    for f in fillers:
        f.close()
    s.close()


def test_outcomes_in_order_within_the_budget(listening: int, closed_port: int, silent: int) -> None:
    targets = [Target("up", "127.0.0.1", listening), Target("gone", "127.0.0.1", closed_port),
               Target("silent", "127.0.0.1", silent), Target("up6", "::1", closed_port)]
    prober = TcpProber(timeout_s=0.3)
    t0 = time.monotonic()
    results = prober.check(targets, 1.0)
    took = time.monotonic() - t0
    assert [r.node for r in results] == ["up", "gone", "silent", "up6"]
    assert [r.outcome for r in results[:3]] == [CheckOutcome.OK, CheckOutcome.REFUSED, CheckOutcome.TIMEOUT]
    assert results[3].outcome in (CheckOutcome.REFUSED, CheckOutcome.UNREACHABLE)  # ::1 may be off
    assert "ECONNREFUSED" in results[1].detail
    assert 0.3 <= results[2].latency_s < 0.5 and took < 0.6


def test_checks_that_do_not_fit_the_budget_are_not_checked(silent: int) -> None:
    targets = [Target(f"n{i}", "127.0.0.1", silent) for i in range(5)]
    results = TcpProber(timeout_s=0.2, max_in_flight=2).check(targets, 0.5)
    outcomes = [r.outcome for r in results]
    assert outcomes[:4] == [CheckOutcome.TIMEOUT] * 4  # two waves of two fit into 0.5 s
    assert outcomes[4] is CheckOutcome.NOT_CHECKED and "before its timeout" in results[4].detail


def test_a_held_up_prober_does_not_count_its_own_silence(silent: int, listening: int) -> None:
    real = time.monotonic
    t0 = real()

    def clock() -> float:
        # 20 ms into the round the daemon is stopped for half a second (seen as a jump)
        return real() + (0.5 if real() - t0 > 0.02 else 0.0)
    results = TcpProber(timeout_s=0.3, clock=clock).check(
        [Target("silent", "127.0.0.1", silent), Target("up", "127.0.0.1", listening)], 1.0)
    assert results[0].outcome is CheckOutcome.NOT_CHECKED and "held up" in results[0].detail
    assert results[1].outcome is CheckOutcome.OK


def test_many_targets_one_thread(listening: int) -> None:
    targets = [Target(f"n{i:04d}", "127.0.0.1", listening) for i in range(300)]
    results = TcpProber(timeout_s=0.8, max_in_flight=50).check(targets, 1.0)
    assert all(r.outcome is CheckOutcome.OK for r in results), {r.outcome for r in results}


def test_a_target_listed_twice_gets_two_results(listening: int, closed_port: int) -> None:
    up = Target("up", "127.0.0.1", listening)
    results = TcpProber(timeout_s=0.3).check([up, Target("gone", "127.0.0.1", closed_port), up], 1.0)
    assert [r.outcome for r in results] == [CheckOutcome.OK, CheckOutcome.REFUSED, CheckOutcome.OK]
