"""What every TOML table of a config file or job spec is built from (pydantic v2).

:class:`Table` is the base of every table model: strict (no coercion: ``nodes = true``
or ``nodes = "2"`` is refused, never read as 1 or 2), unknown keys refused, frozen.
The annotated types below are the shared vocabulary (durations, paths, names, hosts,
mail addresses); each states what it accepts in the words an error shows.

:func:`validate` runs a model and turns pydantic's first error into the project's
one-line message, built from the error's location::

    /etc/b300/b300.toml: [daemon] poll_interval must be a duration like '1h' or '90m', got 'soon'
    spec.toml: [job] nodes must be >= 1, got 0
    spec.toml: [job] environment key 'SLURM_X' uses a reserved prefix (SLURM_, B300_)
    /etc/b300/b300.toml: [checkpoints] unknown key 'keep_hourly' (allowed: allow_signals, ...)

Validators raise :func:`expected` (``must be <what>, got <value>``, or for a table key
``key <value> is not <what>``) or :func:`problem` (the whole text after the key).
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable
from datetime import timedelta
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
)
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, PydanticCustomError

from ..errors import UsageError
from ..model import NODE_NAME_RE
from .duration import DurationError, duration_seconds, short_repr, span

M = TypeVar("M", bound=BaseModel)


class Table(BaseModel):
    """A TOML table: strict types, unknown keys refused, frozen."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


def expected(what: str) -> PydanticCustomError:
    """The value is not ``what`` (e.g. ``"an absolute path"``); the message adds the key and value."""
    return PydanticCustomError("expected", "must be {what}", {"what": what})


def problem(text: str) -> PydanticCustomError:
    """Any other problem; ``text`` follows the key (or the table, for a check across keys)."""
    return PydanticCustomError("problem", "{problem}", {"problem": text})


# -- strings ------------------------------------------------------------------


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise problem("contains a NUL byte")
    return value


#: Any string without a NUL byte.
Text = Annotated[str, AfterValidator(_no_nul)]


def matches(pattern: str, what: str, *, empty: bool = False) -> AfterValidator:
    """For ``Annotated[str, matches(...)]``: the string matches ``pattern`` in full (or is
    ``""``, when ``empty``); else "must be ``what``"."""
    regex = re.compile(pattern)

    def check(value: str) -> str:
        if not (empty and value == "") and not regex.fullmatch(value):
            raise expected(what)
        return value

    return AfterValidator(check)


ABS_PATH = r"/[^\x00\n]*"
#: Letters, digits, ``.``, ``_``, ``-``, starting with a letter or digit, at most 64: the
#: project's one node-name rule (:data:`b300.model.NODE_NAME_RE`), and the same characters for
#: run, partition, account, QOS and target names (Slurm's own names fit; none reaches a shell).
NAME = NODE_NAME_RE.pattern
#: A Unix user or group name, as the daemon's config takes it.
GROUP = r"[A-Za-z_][A-Za-z0-9_.-]{0,31}"
#: A host name, or an IPv6 address in brackets.
HOST = r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:]+\]"
#: A probe, plugin (``kind``) or option name.
PLUGIN = r"[a-z][a-z0-9_]{0,31}"
MAIL = r"[^@\s<>,;\"']+@[A-Za-z0-9.-]+"

AbsPath = Annotated[str, matches(ABS_PATH, "an absolute path")]
#: An absolute path, or ``""`` for "not set".
AbsPathOrEmpty = Annotated[str, matches(ABS_PATH, "an absolute path", empty=True)]
MailAddress = Annotated[str, matches(MAIL, "a mail address")]
ProbeName = Annotated[str, matches(PLUGIN, "a probe name (a-z, 0-9, _)")]
PluginName = Annotated[str, matches(PLUGIN, "a plugin name like filesystem")]
NodeName = Annotated[str, matches(NAME, "a node name (letters, digits, '.', '_', '-'; at most 64)")]


def one_of(*choices: str) -> AfterValidator:
    """For ``Annotated[str, one_of("auto", "cli")]``: the string is one of ``choices``."""
    quoted = [repr(c) for c in choices]
    what = f"{', '.join(quoted[:-1])} or {quoted[-1]}" if len(quoted) > 1 else quoted[0]

    def check(value: str) -> str:
        if value not in choices:
            raise expected(what)
        return value

    return AfterValidator(check)


def blank_means(default: str) -> BeforeValidator:
    """``""`` stands for ``default`` (older configs wrote ``log_format = ""`` for "the default")."""
    return BeforeValidator(lambda value: default if value == "" else value)


def _one_or_many(value: object) -> object:
    return [value] if isinstance(value, str) else value


#: ``"a@x"`` or ``["a@x", "b@y"]``.
MailAddresses = Annotated[list[MailAddress], BeforeValidator(_one_or_many)]


# -- numbers and durations ----------------------------------------------------


#: A TCP port. Other integers are ``Annotated[int, Field(ge=..., le=...)]`` (never a boolean: strict).
Port = Annotated[int, Field(ge=1, le=65535)]


def _duration(value: object) -> float:
    try:
        return duration_seconds(value)
    except DurationError as exc:
        raise problem(str(exc)) from None


def _span(value: object) -> timedelta:
    try:
        return span(value)
    except DurationError as exc:
        raise problem(str(exc)) from None


#: Seconds, from the one duration grammar (:mod:`b300.grammar.duration`).
Duration = Annotated[float, PlainValidator(_duration)]
#: A retention span: a duration, or ``0`` / ``"0"`` for "off".
Span = Annotated[timedelta, PlainValidator(_span)]


def limited(check: Callable[[float], bool], text: str) -> AfterValidator:
    """A bound on a :data:`Duration`: ``text`` says it (``"between 0.2 s and 1 h"``)."""

    def within(seconds: float) -> float:
        if not check(seconds):
            raise problem(f"must be {text}, got {seconds:g} s")
        return seconds

    return AfterValidator(within)


# -- running a model, and its one-line error ----------------------------------


def validate(model: type[M], data: object, where: str, err: type[UsageError],
             prefix: tuple[str, ...] = ()) -> M:
    """``model`` validated from ``data``, or ``err`` with one line naming ``where`` and the key.

    ``prefix`` is the location of ``data`` in its file (``("drift",)`` for a ``[drift]`` table
    validated alone)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise err(f"{where}: {error_text(exc, model, prefix)}") from None


def error_text(exc: ValidationError, model: type[BaseModel], prefix: tuple[str, ...] = ()) -> str:
    """The first problem in ``exc`` as text naming its table and key. Unknown keys come first,
    as a misspelt key often shows up as a second error: the key it should have been is missing."""
    errors = exc.errors(include_url=False)
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    return _describe(first, model, prefix)


def _describe(error: ErrorDetails, model: type[BaseModel], prefix: tuple[str, ...]) -> str:
    loc = tuple(error["loc"])
    full = (*prefix, *loc)
    in_table = bool(prefix) or (bool(loc) and _model(_walk(model, loc[:1])) is not None)
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "extra_forbidden":
        parent = _model(_walk(model, loc[:-1]))
        allowed = f" (allowed: {', '.join(sorted(_fields(parent)))})" if parent else ""
        return _join(_subject(full[:-1], in_table), f"unknown key {loc[-1]!r}{allowed}")
    if loc and loc[-1] == "[key]":  # a table's key itself: (..., "environment", KEY, "[key]")
        subject = _join(_subject(full[:-2], in_table), f"key {short_repr(value)}")
        return _join(subject, f"is not {ctx['what']}" if kind == "expected" else _problem(error))
    subject = _subject(full, in_table)
    if kind == "missing":
        what = "table is missing" if len(full) == 1 and in_table else "is missing"
        hint = _field(model, loc).description if loc else None
        return _join(subject, f"{what} ({hint})" if hint else what)
    return _join(subject, _problem(error))


def _problem(error: ErrorDetails) -> str:
    kind, ctx, value = error["type"], error.get("ctx") or {}, short_repr(error.get("input"))
    if kind == "problem":
        return str(ctx["problem"])
    if kind == "expected":
        return f"must be {ctx['what']}, got {value}"
    if kind in _EXPECTED:
        return f"must be {_EXPECTED[kind]}, got {value}"
    if kind in _BOUNDS:
        op, key = _BOUNDS[kind]
        return f"must be {op} {ctx[key]}, got {value}"
    if kind == "literal_error":
        return f"must be {ctx['expected']}, got {value}"
    if kind == "value_error":  # a model's own check (ValueError), e.g. [liveness]'s
        return str(ctx.get("error", error["msg"]))
    msg = error["msg"]
    return msg[:1].lower() + msg[1:]


_EXPECTED = {
    "int_type": "an integer", "bool_type": "true or false", "string_type": "a string",
    "float_type": "a number", "list_type": "an array", "tuple_type": "an array", "dict_type": "a table",
    "model_type": "a table",
}
_BOUNDS = {"greater_than_equal": (">=", "ge"), "less_than_equal": ("<=", "le"),
           "greater_than": (">", "gt"), "less_than": ("<", "lt")}
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _join(subject: str, text: str) -> str:
    return f"{subject} {text}" if subject else text


def _subject(loc: tuple[int | str, ...], in_table: bool) -> str:
    """``[daemon] poll_interval``, ``[drift] nodes.gpu01.port``, ``[checkpoints] targets[0]``."""
    head, rest = (f"[{loc[0]}]", loc[1:]) if in_table and loc else ("", loc)
    path = ""
    for part in rest:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            key = part if _BARE_KEY.fullmatch(part) else repr(part)
            path += f".{key}" if path else key
    return f"{head} {path}".strip()


# Walking the models along an error's location: which table it is in, its allowed keys, a
# missing key's description.


def _fields(model: type[BaseModel]) -> dict[str, FieldInfo]:
    return {info.alias or name: info for name, info in model.model_fields.items()}


def _field(model: type[BaseModel], loc: tuple[int | str, ...]) -> FieldInfo:
    parent = _model(_walk(model, loc[:-1]))
    return (_fields(parent).get(str(loc[-1])) if parent else None) or FieldInfo()


def _model(tp: Any) -> type[BaseModel] | None:
    tp = _strip(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _strip(tp: Any) -> Any:
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            members = [a for a in get_args(tp) if a is not type(None)]
            if len(members) != 1:
                return tp
            tp = members[0]
        else:
            return tp


def _walk(tp: Any, loc: tuple[int | str, ...]) -> Any:
    for part in loc:
        tp = _strip(tp)
        model = _model(tp)
        if model is not None:
            info = _fields(model).get(str(part))
            if info is None:
                return None
            tp = info.annotation
            continue
        origin, args = get_origin(tp), get_args(tp)
        if origin in (list, tuple) and isinstance(part, int) and args:
            tp = args[0]
        elif origin is dict and part != "[key]" and len(args) == 2:
            tp = args[1]
        else:
            return None
    return tp
