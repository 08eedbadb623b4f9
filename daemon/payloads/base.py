"""What every payload type shares: the readers of a stored value, and :class:`Payload`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import field, fields
from typing import Any, ClassVar, Protocol, Self, cast

from ..events import Kind


class Recorded(Protocol):
    """An event as stored (:class:`b300.model.Event`) or about to be (``NewEvent``)."""

    @property
    def kind(self) -> str: ...

    @property
    def data(self) -> Mapping[str, Any]: ...


def _text(value: object) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def _opt_text(value: object) -> str | None:
    return None if value is None else value if isinstance(value, str) else str(value)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _seconds(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _id(value: object) -> int | None:
    """An id, also as the digits an older writer stored it as."""
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return _int(value)


def _true(value: object) -> bool:
    return value is True


def _truthy(value: object) -> bool:
    return bool(value)


def _names(value: object) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list | tuple) else ()


def _key(read: Callable[[object], Any], default: Any, key: str | None = None) -> Any:
    """A payload field: ``read`` turns the stored value into the field's type; ``key`` is
    the stored key when it is not the field's name (``from``, ``to``)."""
    return field(default=default, metadata={"read": read, "key": key})


class Payload:
    """What every payload type shares: its kind and the typed accessor.

    ``ALSO``: the other kinds of a group that readers take together (a group of
    :mod:`b300.events`, like ``DRAINS``); each key the type reads means the same in all of
    them, and a key one of them does not carry reads as the field's default."""

    KIND: ClassVar[Kind]
    ALSO: ClassVar[tuple[Kind, ...]] = ()

    @classmethod
    def kinds(cls) -> tuple[Kind, ...]:
        """Every kind this type reads: ``KIND``, then ``ALSO``."""
        return (cls.KIND, *cls.ALSO)

    @classmethod
    def of(cls, event: Recorded) -> Self:
        """``event``'s payload as this type (ValueError: the event is of another kind)."""
        if event.kind not in cls.kinds():
            raise ValueError(f"{cls.__name__} reads {' or '.join(cls.kinds())} events, not {event.kind}")
        return cls.from_data(event.data)

    @classmethod
    def from_data(cls, data: Mapping[str, object]) -> Self:
        values: dict[str, Any] = {}
        for f in fields(cast(Any, cls)):
            key = f.metadata.get("key") or f.name
            if key in data:
                values[f.name] = f.metadata["read"](data[key])
        return cast(Self, cast(Any, cls)(**values))
