"""Many datagrams per system call: sendmmsg(2) and recvmmsg(2) through ctypes (Linux).

A round of the ICMP probe sends one small packet to every node in use and reads one
back from each: at 10,000 nodes that is 20,000 system calls and 20,000 Python-level
packets a second. :class:`SendBatch` keeps every target's address and packet in
buffers built once for a set of addresses, so a round writes its packets with one copy
and sends them with one call per window; :class:`RecvRing` reads up to
:data:`RING_SLOTS` packets per call into fixed slots. Both are used only when
:func:`available` (glibc or musl on Linux: the calls exist in the C library);
otherwise the prober sends and reads one packet at a time, as before.

No packet is parsed here: the caller reads the slots.
"""

from __future__ import annotations

import ctypes
import errno
import socket
import struct
import sys
from array import array
from collections.abc import Sequence

#: Slots of a receive call; each holds one packet of up to :data:`SLOT_SIZE` bytes.
RING_SLOTS = 256
#: Bytes kept of each packet read: an IP header with options (60), an ICMP error header
#: (8), the quoted IP header with options (60) and the quoted ICMP header (8) fit.
SLOT_SIZE = 192
_MSG_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0x40)
_SOCKADDR_IN = 16


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [("msg_name", ctypes.c_void_p), ("msg_namelen", ctypes.c_uint32),
                ("msg_iov", ctypes.c_void_p), ("msg_iovlen", ctypes.c_size_t),
                ("msg_control", ctypes.c_void_p), ("msg_controllen", ctypes.c_size_t),
                ("msg_flags", ctypes.c_int)]


class _Mmsghdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _Msghdr), ("msg_len", ctypes.c_uint)]


_MSG = ctypes.sizeof(_Mmsghdr)
_IOV = ctypes.sizeof(_Iovec)
_NAME_AT = _Mmsghdr.msg_hdr.offset + _Msghdr.msg_name.offset
_NAMELEN_AT = _Mmsghdr.msg_hdr.offset + _Msghdr.msg_namelen.offset
_IOV_AT = _Mmsghdr.msg_hdr.offset + _Msghdr.msg_iov.offset
_IOVLEN_AT = _Mmsghdr.msg_hdr.offset + _Msghdr.msg_iovlen.offset
_LEN_AT = _Mmsghdr.msg_len.offset
_PTR = "P"
_SIZE = "N"


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        send, recv = libc.sendmmsg, libc.recvmmsg
    except (OSError, AttributeError):
        return None
    send.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
    send.restype = ctypes.c_int
    recv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
    recv.restype = ctypes.c_int
    return libc


_LIBC = _libc()


def available() -> bool:
    """Whether sendmmsg/recvmmsg can be called here (Linux with a C library that has them)."""
    return _LIBC is not None


def _entry() -> struct.Struct:
    """The fields of one mmsghdr we set (msg_name, msg_namelen, msg_iov, msg_iovlen: in
    this order in every C library), with pads at the offsets of the ctypes layout."""
    fmt, at = "@", 0
    for offset, kind in ((_NAME_AT, _PTR), (_NAMELEN_AT, "I"), (_IOV_AT, _PTR), (_IOVLEN_AT, _SIZE)):
        fmt += f"{offset - at}x{kind}"
        at = offset + struct.calcsize("@" + kind)
    entry = struct.Struct(f"{fmt}{_MSG - at}x")
    if entry.size != _MSG:
        raise ImportError(f"mmsghdr layout: {entry.size} != {_MSG}")
    return entry


_ENTRY = _entry()


def _headers(count: int, names: int, name_len: int, iovs: int) -> ctypes.Array[ctypes.c_char]:
    """``count`` mmsghdr entries, entry i naming ``names + i * name_len`` and holding the
    one iovec at ``iovs + i * sizeof(iovec)``."""
    data = b"".join([_ENTRY.pack(names + i * name_len, name_len, iovs + i * _IOV, 1) for i in range(count)])
    return ctypes.create_string_buffer(data, max(1, count) * _MSG)


def _iovecs(count: int, base: int, size: int) -> ctypes.Array[ctypes.c_char]:
    pair = struct.Struct("@" + _PTR + _SIZE)  # iov_base, iov_len: no padding between them
    data = b"".join([pair.pack(base + i * size, size) for i in range(count)])
    return ctypes.create_string_buffer(data, max(1, count) * _IOV)


def sockaddr_in(packed: bytes) -> bytes:
    """A ``struct sockaddr_in`` for the IPv4 address ``packed`` (4 bytes), port 0."""
    return struct.pack("=H", socket.AF_INET) + b"\0\0" + packed + bytes(8)


class SendBatch:
    """One packet of ``size`` bytes to each of ``addresses`` (4-byte IPv4 addresses), in order.

    Built once for a set of addresses (the buffers are the kernel's view: they live as
    long as this object); :meth:`packets` is where a round's packets are written, :meth:`send` sends a run.
    """

    def __init__(self, addresses: Sequence[bytes], size: int) -> None:
        n = len(addresses)
        self.size = size
        names = b"".join(map(sockaddr_in, addresses))
        self._names = ctypes.create_string_buffer(names, max(1, n) * _SOCKADDR_IN)
        self._packets = ctypes.create_string_buffer(max(1, n) * size)
        self._iovs = _iovecs(n, ctypes.addressof(self._packets), size)
        self._msgs = _headers(n, ctypes.addressof(self._names), _SOCKADDR_IN, ctypes.addressof(self._iovs))
        self._base = ctypes.addressof(self._msgs)
        self._count = n

    def packets(self) -> memoryview:
        """The packets' buffer (``size`` bytes each, in the addresses' order) to write a
        round's packets into, in place."""
        return memoryview(self._packets).cast("B")[:self._count * self.size]

    def send(self, fd: int, start: int, count: int) -> tuple[int, int | None]:
        """Send packets ``start`` .. ``start + count - 1``: how many went, and the errno of the
        first that did not (None when all went, or when the kernel stopped early without one)."""
        count = max(0, min(count, self._count - start))
        if count == 0 or _LIBC is None:
            return 0, None if count == 0 else errno.ENOSYS
        sent = int(_LIBC.sendmmsg(fd, self._base + start * _MSG, count, 0))
        if sent < 0:
            return 0, ctypes.get_errno() or errno.EIO
        return sent, None


class RecvRing:
    """:data:`RING_SLOTS` receive slots with the sender's address: :meth:`recv` fills them."""

    def __init__(self) -> None:
        self._data = ctypes.create_string_buffer(RING_SLOTS * SLOT_SIZE)
        self._names = ctypes.create_string_buffer(RING_SLOTS * _SOCKADDR_IN)
        self._iovs = _iovecs(RING_SLOTS, ctypes.addressof(self._data), SLOT_SIZE)
        self._msgs = _headers(RING_SLOTS, ctypes.addressof(self._names), _SOCKADDR_IN,
                              ctypes.addressof(self._iovs))
        self._namelens = memoryview(self._msgs).cast("B").cast("I")[_NAMELEN_AT // 4::_MSG // 4]
        self._reset = array("I", [_SOCKADDR_IN]) * RING_SLOTS

    def recv(self, fd: int) -> tuple[int, int | None, bytes, list[int], bytes]:
        """One non-blocking recvmmsg: (packets read, errno when none could be, the slots'
        bytes (``SLOT_SIZE`` apart), each packet's length, the senders' sockaddr_in)."""
        if _LIBC is None:
            return 0, errno.ENOSYS, b"", [], b""
        self._namelens[:] = self._reset  # the kernel wrote the last call's lengths there
        got = int(_LIBC.recvmmsg(fd, ctypes.addressof(self._msgs), RING_SLOTS, _MSG_DONTWAIT, None))
        if got <= 0:
            return 0, (ctypes.get_errno() or errno.EIO) if got < 0 else None, b"", [], b""
        lens = memoryview(self._msgs).cast("B").cast("I")[_LEN_AT // 4::_MSG // 4][:got].tolist()
        return (got, None, ctypes.string_at(self._data, got * SLOT_SIZE), lens,
                ctypes.string_at(self._names, got * _SOCKADDR_IN))
