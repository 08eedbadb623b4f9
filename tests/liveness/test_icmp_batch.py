"""The batched ICMP round: its echo requests (pure), the batch loop's windows and timeouts
(a scripted socket and clock), and a real round over loopback addresses, batched and one
packet at a time (needs a raw or ping socket: root here; skipped with the reason otherwise)."""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from b300.liveness import mmsg
from b300.liveness.batch import Answer, checksum, run_batch
from b300.liveness.icmp import (
    IcmpProber,
    _EchoSocket,
    _Plan,
    echo_packets,
    open_icmp_socket,
    write_echo_packets,
)
from b300.liveness.verdicts import CheckOutcome, Target


@given(st.integers(1, 3000), st.integers(0, 0xFFFF), st.integers(0, 0xFFFF), st.binary(min_size=8, max_size=8))
@settings(max_examples=300)
def test_every_echo_request_carries_its_sequence_and_a_valid_checksum(count: int, ident: int, base: int,
                                                                      token: bytes) -> None:
    base = min(base, 65536 - count)
    data = echo_packets(count, ident, base, token)
    assert len(data) == 16 * count
    for i in range(count):
        packet = data[16 * i:16 * i + 16]
        kind, code, _sum, got_ident, seq = struct.unpack("!BBHHH", packet[:8])
        assert (kind, code, got_ident, seq, packet[8:]) == (8, 0, ident, base + i, token)
        assert checksum(packet) == 0  # RFC 1071: a packet with its checksum sums to zero


@given(st.integers(1, 600), st.integers(0, 0xFFFF), st.integers(0, 0xFFFF), st.binary(min_size=8, max_size=8),
       st.binary(min_size=1, max_size=64))
@settings(max_examples=100)
def test_requests_written_in_place_over_the_last_rounds_are_the_same(count: int, ident: int, base: int,
                                                                      token: bytes, old: bytes) -> None:
    base = min(base, 65536 - count)
    buf = bytearray((old * (1 + 16 * (count + 1) // len(old)))[:16 * (count + 1)])  # one packet more
    tail = bytes(buf[16 * count:])
    write_echo_packets(memoryview(buf), count, ident, base, token)
    assert bytes(buf[:16 * count]) == echo_packets(count, ident, base, token)
    assert bytes(buf[16 * count:]) == tail


def test_the_checksum_wraps_where_the_sum_does() -> None:
    # Type 8 (0x0800), identifier 1, sequence 0 and a token summing to 0xF7FE: request 0's
    # one's-complement sum is 0xFFFF, its checksum 0. Request 1's sum wraps to 0x0001: its
    # checksum must be 0xFFFE (not 0xFFFF, which a plain 16-bit decrement would give).
    token = (0xF7FE).to_bytes(2, "big") + bytes(6)
    data = echo_packets(3, 1, 0, token)
    assert data[2:4] == b"\0\0" and data[18:20] == b"\xff\xfe" and data[34:36] == b"\xff\xfd"
    assert [checksum(data[i:i + 16]) for i in (0, 16, 32)] == [0, 0, 0]


def test_echo_packets_refuses_sequences_past_16_bits() -> None:
    with pytest.raises(ValueError):
        echo_packets(10, 1, 65530, bytes(8))
    with pytest.raises(ValueError):
        echo_packets(1, 1, 0, bytes(7))


class _Scripted:
    """A probe socket whose targets answer as scripted: positions in ``alive`` answer at
    the next read after their send, ``refuse`` (position -> errno) fails its send once
    or always, and the socket buffer is full (EAGAIN) for the first ``full`` send calls."""

    def __init__(self, alive: set[int], refuse: dict[int, int], full: int = 0) -> None:
        self._pair = socket.socketpair()
        self.alive, self.refuse, self.full = alive, refuse, full
        self.sent: list[int] = []
        self.calls: list[tuple[int, int]] = []
        self._pending: list[int] = []

    def fileno(self) -> int:
        return self._pair[0].fileno()

    def send_run(self, start: int, count: int) -> tuple[int, int | None]:
        self.calls.append((start, count))
        if self.full:
            self.full -= 1
            return 0, errno.EAGAIN
        for k in range(count):
            if start + k in self.refuse:
                return k, self.refuse[start + k]
            self.sent.append(start + k)
            self._pending.append(start + k)
        return count, None

    def receive(self) -> list[Answer]:
        out = [(p, CheckOutcome.OK, "echo reply") for p in self._pending if p in self.alive]
        self._pending = []
        return out

    def close(self) -> None:
        for s in self._pair:
            s.close()


def _clock(step: float) -> Iterator[float]:
    t = 0.0
    while True:
        t += step
        yield t


def test_the_batch_loop_sends_in_windows_in_order_and_times_out_the_silent() -> None:
    n = 25
    targets = [Target(f"n{i}", f"10.0.0.{i + 1}", 1) for i in range(n)]
    sock = _Scripted(alive={i for i in range(n) if i % 4}, refuse={7: errno.EHOSTUNREACH, 11: errno.EPERM},
                     full=2)
    ticks = _clock(0.01)
    try:
        results = run_batch(sock, targets, 5.0, timeout_s=0.3, max_in_flight=6, clock=lambda: next(ticks),
                            sleep=lambda s: None)
    finally:
        sock.close()
    assert [r.node for r in results] == [t.node for t in targets]
    assert sock.sent == [i for i in range(n) if i not in (7, 11)]  # each once, in order
    assert all(count <= 6 for _, count in sock.calls)  # never more than the window in flight
    assert sock.calls[:2] == [(0, 6), (0, 6)]  # the full buffer: the same run again, later
    for i, r in enumerate(results):
        if i == 7:
            assert r.outcome is CheckOutcome.UNREACHABLE and "EHOSTUNREACH" in r.detail
        elif i == 11:
            assert r.outcome is CheckOutcome.NOT_CHECKED and r.detail.startswith("send: EPERM")
        elif i % 4:
            assert r.outcome is CheckOutcome.OK, (i, r)
        else:
            assert (r.outcome, r.detail) == (CheckOutcome.TIMEOUT, "silent") and r.latency_s >= 0.3, (i, r)


def test_the_round_end_cuts_what_has_not_timed_out() -> None:
    targets = [Target(f"n{i}", f"10.0.0.{i + 1}", 1) for i in range(4)]
    sock = _Scripted(alive=set(), refuse={})
    ticks = _clock(0.05)
    try:
        results = run_batch(sock, targets, 0.4, timeout_s=0.8, max_in_flight=2, clock=lambda: next(ticks),
                            sleep=lambda s: None)
    finally:
        sock.close()
    # Two went out and waited; the round ended before their timeout and before the rest went.
    assert [r.outcome for r in results] == [CheckOutcome.NOT_CHECKED] * 4
    assert [r.detail for r in results[:2]] == ["the round ended before its timeout"] * 2
    assert [r.detail for r in results[2:]] == ["not sent within this round's budget"] * 2


def _icmp_unavailable() -> str:
    try:
        open_icmp_socket()[0].close()
    except OSError as exc:
        return f"no ICMP socket here: {exc.strerror}"
    return ""


@pytest.mark.skipif(bool(_icmp_unavailable()), reason=_icmp_unavailable() or "-")
@pytest.mark.parametrize("batched", [True, False])
def test_a_round_over_many_loopback_addresses(batched: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every 127.x address is this host: all answer, in the targets' order; an IPv6 target in
    the middle is not checked by ICMP and does not stop the batch. ``batched=False`` runs
    the one-packet-at-a-time path (a system without sendmmsg/recvmmsg)."""
    if batched and not mmsg.available():
        pytest.skip("sendmmsg/recvmmsg are not available here")
    if not batched:
        monkeypatch.setattr(mmsg, "available", lambda: False)
    targets = [Target(f"n{i}", f"127.1.{i // 250}.{i % 250 + 1}", 1) for i in range(1500)]
    targets.insert(700, Target("v6", "::1", 1))
    prober = IcmpProber(timeout_s=0.8, max_in_flight=512)
    for _ in range(2):  # the second round reuses the first one's buffers
        results = prober.check(targets, 1.0)
        assert [r.node for r in results] == [t.node for t in targets]
        assert results[700].outcome is CheckOutcome.NOT_CHECKED and "EAFNOSUPPORT" in results[700].detail
        bad = [r for i, r in enumerate(results) if i != 700 and r.outcome is not CheckOutcome.OK]
        assert not bad, bad[:5]
    # Another set of nodes in use: the buffers follow it.
    results = prober.check(targets[:10], 1.0)
    assert [r.outcome for r in results] == [CheckOutcome.OK] * 10


def _reply_slots(sock: _EchoSocket, positions: list[int], sources: list[bytes]) -> tuple[bytes, list[int]]:
    """A raw socket's batched read (b300.liveness.mmsg.RecvRing) of echo replies from
    ``sources`` naming ``positions``: a 20-byte IP header, the reply's 16 bytes, one slot each."""
    blob = b""
    for position, source in zip(positions, sources, strict=True):
        echo = struct.pack("!BBHHH", 0, 0, 0, sock._ident, (sock._base + position) & 0xFFFF) + sock._token
        ip = bytes([0x45]) + bytes(11) + source + socket.inet_aton("127.0.0.1")
        blob += (ip + echo).ljust(mmsg.SLOT_SIZE, b"\0")
    return blob, [36] * len(positions)


@pytest.mark.parametrize("got", [mmsg.RING_SLOTS, 17])
def test_a_read_of_replies_counts_as_a_whole_only_when_every_slot_is_ours(got: int) -> None:
    """A full or partial read of this round's replies: all are answers. One reply with a
    wrong token, identifier or sender, or naming a position past the round's, is left out
    and the rest still count (slot by slot)."""
    targets = [Target(f"n{i}", f"127.2.{i // 250}.{i % 250 + 1}", 1) for i in range(600)]
    plan = _Plan(tuple(t.host for t in targets))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:  # stands in for the raw socket
        sock = _EchoSocket(udp, False, targets, plan)
        positions = [(37 * k) % 600 for k in range(got)]
        sources = [socket.inet_aton(targets[p].host) for p in positions]
        blob, lens = _reply_slots(sock, positions, sources)
        out: list[Answer] = []
        sock._slots(got, blob, lens, b"", out)
        assert out == [(p, CheckOutcome.OK, "echo reply") for p in positions]
        size, bad = mmsg.SLOT_SIZE, 5
        at = bad * size
        broken = {
            "token": blob[:at + 28] + bytes([blob[at + 28] ^ 1]) + blob[at + 29:],
            "identifier": blob[:at + 24] + bytes([blob[at + 24] ^ 1]) + blob[at + 25:],
            "sender": blob[:at + 12] + socket.inet_aton(targets[positions[bad] + 1].host) + blob[at + 16:],
            "position": _reply_slots(sock, [*positions[:bad], 600, *positions[bad + 1:]],
                                     [*sources[:bad], socket.inet_aton("127.9.9.9"), *sources[bad + 1:]])[0],
            "type": blob[:at + 20] + bytes([8]) + blob[at + 21:],
        }
        for what, data in broken.items():
            out = []
            sock._slots(got, data, lens, b"", out)
            rest = [p for k, p in enumerate(positions) if k != bad]
            assert out == [(p, CheckOutcome.OK, "echo reply") for p in rest], what
