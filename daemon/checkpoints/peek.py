"""Looking inside checkpoint files without trusting them.

Frameworks describe their checkpoints in pickles (DCP's ``.metadata``, the
``data.pkl`` inside every ``torch.save`` zip). Unpickling runs whatever the file
says, so this module never unpickles: :func:`read_pickle` walks the opcodes
with a small stack machine that builds plain values (dict, list, tuple, str,
int, float, bytes, None, bool) and turns every class, call and persistent id
into an inert :class:`Opaque` that only records its name, arguments and state.
Nothing is imported and nothing is called, whatever the pickle names.

:func:`zip_problem` tells a complete ``torch.save`` file (a zip whose central
directory is there and whose members lie inside the file) from one cut off or
still being written, reading only the directory at the end of the file.
"""

from __future__ import annotations

import io
import struct
import zipfile
from dataclasses import dataclass, field
from typing import Any

#: Larger pickles are not read (a torch ``data.pkl`` holds names and shapes, not tensor data).
MAX_PICKLE_BYTES = 64 << 20
_MAX_OPS = 5_000_000


class PeekError(ValueError):
    """The bytes are not a pickle this reader understands (or are cut off)."""


@dataclass(eq=False)
class Opaque:
    """A class, call or object from a pickle, never instantiated.

    ``name`` is ``module.qualname`` of the class or function; ``args`` what it
    would have been called with; ``state`` what ``BUILD`` would have set;
    ``items``/``appended`` what ``SETITEM(S)``/``APPEND(S)`` added to it.
    """

    name: str
    args: tuple[Any, ...] = ()
    state: Any = None
    items: dict[Any, Any] = field(default_factory=dict)
    appended: list[Any] = field(default_factory=list)

    def __hash__(self) -> int:
        return id(self)

    def fields(self) -> dict[str, Any]:
        """The object's attributes as a dict: its ``__dict__`` state (and slots), or its items."""
        state = self.state
        out: dict[str, Any] = {}
        if isinstance(state, tuple) and len(state) == 2:
            for part in state:
                if isinstance(part, dict):
                    out.update(part)
        elif isinstance(state, dict):
            out.update(state)
        out.update({k: v for k, v in self.items.items() if isinstance(k, str)})
        return out


class _Mark:
    pass


_MARK = _Mark()


def _key(value: Any) -> Any:
    """A dict key: unhashable values (lists, dicts) become their id (they are never looked up)."""
    try:
        hash(value)
    except TypeError:
        return ("unhashable", id(value))
    return value


def read_pickle(data: bytes) -> Any:
    """The value a pickle describes, built from inert parts (see the module docstring).

    Raises PeekError for anything that is not a complete pickle of protocol 2-5.
    """
    if len(data) > MAX_PICKLE_BYTES:
        raise PeekError(f"pickle larger than {MAX_PICKLE_BYTES} bytes")
    buf = io.BytesIO(data)
    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[int, Any] = {}

    def read(n: int) -> bytes:
        chunk = buf.read(n)
        if len(chunk) != n:
            raise PeekError("pickle is cut off")
        return chunk

    def u(fmt: str, n: int) -> int:
        return int(struct.unpack(fmt, read(n))[0])

    def pop_mark() -> list[Any]:
        if not marks:
            raise PeekError("pickle pops a mark it never set")
        start = marks.pop()
        items = stack[start:]
        del stack[start:]
        return items

    def pop() -> Any:
        if not stack:
            raise PeekError("pickle pops an empty stack")
        return stack.pop()

    def set_items(target: Any, pairs: list[Any]) -> None:
        if len(pairs) % 2:
            raise PeekError("odd SETITEMS")
        dest = target if isinstance(target, dict) else target.items if isinstance(target, Opaque) else None
        if dest is None:
            raise PeekError(f"SETITEMS on {type(target).__name__}")
        for i in range(0, len(pairs), 2):
            dest[_key(pairs[i])] = pairs[i + 1]

    def append(target: Any, values: list[Any]) -> None:
        if isinstance(target, list):
            target.extend(values)
        elif isinstance(target, Opaque):
            target.appended.extend(values)
        else:
            raise PeekError(f"APPENDS on {type(target).__name__}")

    for _ in range(_MAX_OPS):
        op = buf.read(1)
        if not op:
            raise PeekError("pickle is cut off (no STOP)")
        code = op[0]
        if code == 0x80:  # PROTO
            if read(1)[0] > 5:
                raise PeekError("pickle protocol newer than 5")
        elif code == 0x95:  # FRAME
            read(8)
        elif code == 0x2E:  # STOP
            if len(stack) != 1:
                raise PeekError("pickle ends with a malformed stack")
            return stack[0]
        elif code == 0x28:  # MARK
            marks.append(len(stack))
        elif code == 0x4E:  # NONE
            stack.append(None)
        elif code == 0x88:  # NEWTRUE
            stack.append(True)
        elif code == 0x89:  # NEWFALSE
            stack.append(False)
        elif code == 0x4A:  # BININT
            stack.append(u("<i", 4))
        elif code == 0x4B:  # BININT1
            stack.append(read(1)[0])
        elif code == 0x4D:  # BININT2
            stack.append(u("<H", 2))
        elif code == 0x8A:  # LONG1
            stack.append(int.from_bytes(read(read(1)[0]), "little", signed=True))
        elif code == 0x8B:  # LONG4
            n = u("<i", 4)
            if n < 0 or n > 1 << 16:
                raise PeekError("LONG4 too long")
            stack.append(int.from_bytes(read(n), "little", signed=True))
        elif code == 0x47:  # BINFLOAT
            stack.append(struct.unpack(">d", read(8))[0])
        elif code == 0x8C:  # SHORT_BINUNICODE
            stack.append(read(read(1)[0]).decode("utf-8", "surrogatepass"))
        elif code == 0x58:  # BINUNICODE
            stack.append(read(u("<I", 4)).decode("utf-8", "surrogatepass"))
        elif code == 0x8D:  # BINUNICODE8
            stack.append(read(u("<Q", 8)).decode("utf-8", "surrogatepass"))
        elif code == 0x43:  # SHORT_BINBYTES
            stack.append(read(read(1)[0]))
        elif code == 0x42:  # BINBYTES
            stack.append(read(u("<I", 4)))
        elif code == 0x8E:  # BINBYTES8
            stack.append(read(u("<Q", 8)))
        elif code == 0x96:  # BYTEARRAY8
            stack.append(bytearray(read(u("<Q", 8))))
        elif code == 0x55:  # SHORT_BINSTRING
            stack.append(read(read(1)[0]).decode("latin-1"))
        elif code == 0x54:  # BINSTRING
            stack.append(read(u("<i", 4)).decode("latin-1"))
        elif code == 0x7D:  # EMPTY_DICT
            stack.append({})
        elif code == 0x5D:  # EMPTY_LIST
            stack.append([])
        elif code == 0x29:  # EMPTY_TUPLE
            stack.append(())
        elif code == 0x8F:  # EMPTY_SET
            stack.append(Opaque("builtins.set"))
        elif code == 0x90:  # ADDITEMS
            items = pop_mark()
            append(stack[-1] if stack else None, items)
        elif code == 0x91:  # FROZENSET
            stack.append(Opaque("builtins.frozenset", appended=pop_mark()))
        elif code == 0x85:  # TUPLE1
            stack.append((pop(),))
        elif code == 0x86:  # TUPLE2
            b = pop()
            stack.append((pop(), b))
        elif code == 0x87:  # TUPLE3
            c = pop()
            b = pop()
            stack.append((pop(), b, c))
        elif code == 0x74:  # TUPLE
            stack.append(tuple(pop_mark()))
        elif code == 0x6C:  # LIST
            stack.append(pop_mark())
        elif code == 0x64:  # DICT
            d: dict[Any, Any] = {}
            set_items(d, pop_mark())
            stack.append(d)
        elif code == 0x73:  # SETITEM
            value = pop()
            key = pop()
            set_items(stack[-1] if stack else None, [key, value])
        elif code == 0x75:  # SETITEMS
            pairs = pop_mark()
            set_items(stack[-1] if stack else None, pairs)
        elif code == 0x61:  # APPEND
            value = pop()
            append(stack[-1] if stack else None, [value])
        elif code == 0x65:  # APPENDS
            values = pop_mark()
            append(stack[-1] if stack else None, values)
        elif code == 0x71:  # BINPUT
            memo[read(1)[0]] = stack[-1] if stack else None
        elif code == 0x72:  # LONG_BINPUT
            memo[u("<I", 4)] = stack[-1] if stack else None
        elif code == 0x94:  # MEMOIZE
            memo[len(memo)] = stack[-1] if stack else None
        elif code in (0x68, 0x6A):  # BINGET, LONG_BINGET
            idx = read(1)[0] if code == 0x68 else u("<I", 4)
            if idx not in memo:
                raise PeekError("pickle refers to a memo entry it never made")
            stack.append(memo[idx])
        elif code == 0x63:  # GLOBAL "module\nname\n"
            module = buf.readline().decode("utf-8", "replace").rstrip("\n")
            name = buf.readline().decode("utf-8", "replace").rstrip("\n")
            stack.append(Opaque(f"{module}.{name}"))
        elif code == 0x93:  # STACK_GLOBAL
            name = pop()
            module = pop()
            stack.append(Opaque(f"{module}.{name}"))
        elif code in (0x52, 0x81):  # REDUCE, NEWOBJ
            args = pop()
            cls = pop()
            stack.append(Opaque(_name(cls), tuple(args) if isinstance(args, tuple) else (args,)))
        elif code == 0x92:  # NEWOBJ_EX
            pop()  # kwargs
            args = pop()
            cls = pop()
            stack.append(Opaque(_name(cls), tuple(args) if isinstance(args, tuple) else (args,)))
        elif code == 0x62:  # BUILD
            state = pop()
            target = stack[-1] if stack else None
            if isinstance(target, Opaque):
                target.state = state
        elif code == 0x51:  # BINPERSID
            stack.append(Opaque("persistent_id", (pop(),)))
        elif code == 0x97:  # NEXT_BUFFER
            stack.append(Opaque("pickle.PickleBuffer"))
        elif code == 0x98:  # READONLY_BUFFER
            pass
        elif code == 0x30:  # POP
            pop()
        elif code == 0x31:  # POP_MARK
            pop_mark()
        elif code == 0x32:  # DUP
            stack.append(stack[-1] if stack else None)
        else:
            raise PeekError(f"pickle opcode {op!r} is not read here")
    raise PeekError("pickle too long")


def _name(value: Any) -> str:
    return value.name if isinstance(value, Opaque) else f"<{type(value).__name__}>"


def zip_problem(path: str) -> str:
    """'' when ``path`` is a complete zip (as ``torch.save`` writes); else why not, one line."""
    try:
        with zipfile.ZipFile(path) as zf:
            size = zf.fp.seek(0, io.SEEK_END) if zf.fp is not None else 0
            infos = zf.infolist()
            if not infos:
                return "an empty zip"
            for info in infos:
                if info.header_offset + info.compress_size > size:
                    return f"zip member {info.filename!r} lies past the end of the file"
    except zipfile.BadZipFile as exc:
        return f"not a complete zip ({exc})"
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    return ""


def torch_pickle(path: str) -> Any:
    """The top-level value of a ``torch.save`` zip (its ``data.pkl``), read with :func:`read_pickle`.

    Raises PeekError when the file is not such a zip or its pickle cannot be read.
    """
    try:
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
            if not names:
                raise PeekError("no data.pkl in the zip")
            info = zf.getinfo(min(names, key=len))
            if info.file_size > MAX_PICKLE_BYTES:
                raise PeekError("data.pkl is too large to read")
            data = zf.read(info)
    except (zipfile.BadZipFile, OSError, RuntimeError, EOFError) as exc:
        raise PeekError(f"not a readable torch.save zip ({exc})") from exc
    return read_pickle(data)
