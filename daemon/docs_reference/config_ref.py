"""``docs/reference/config.md``: every config table and key, read from the pydantic models.

What each key is comes from the table models (:class:`b300.config.tables.ConfigFile` and
the models it holds): type, bounds and choices from the annotations and their validators,
the default from the field, the description from ``Field(description=...)``, else the
``#:`` comment above the field, else the comment at the end of its line.

Whether a key reloads live on SIGHUP is not listed by hand: for each key the generator
builds two configs that differ in that key only and asks the daemon's own
:func:`b300.app.reloader.plan_reload` whether the change is applied or needs a restart.
"""

from __future__ import annotations

import copy
import inspect
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from .text import cell, clean_docstring

#: A complete, valid config the per-key trials start from: ``[drift]`` present (it is
#: optional) and ``[report]`` with an SMTP host (``[alerts] mail_to`` needs one).
BASE_DOC: dict[str, Any] = {
    # PostgreSQL, so that database_password_file (refused beside SQLite) can be tried too.
    "daemon": {"database_url": "postgresql+psycopg://b300@db.example.org/b300"},
    "drift": {"known_hosts": "/etc/b300/known_hosts", "nodes": {"node1": "node1"}},
    "report": {"smtp_host": "mail.example.org"},
}

#: Values tried, in order, to change a key whose type gives no better candidate.
_STRINGS = ("/srv/b300-reference", "debug", "json", "sqlite:////srv/b300-reference/state.db",
            "ops@example.org", "127.0.0.1:9301", "https://example.org/hook", "mail2.example.org",
            "tue", "Europe/Berlin", "alt", "dcp")
_LISTS: tuple[list[Any], ...] = (
    ["ops@example.org"], ["/usr/bin/true", "{node}"], ["/srv/b300-reference"], ["driver"], ["JOB_ERROR"],
    [{"name": "offsite", "kind": "filesystem", "path": "/srv/replicas/{run}"}],
    [{"partition": "gpu", "nodes": 1}], [{"name": "nccl", "argv": ["/usr/bin/true"], "timeout_s": 30.0}])
_TABLES: tuple[dict[str, Any], ...] = ({"node2": "node2"}, {"driver": "warn"}, {"driver": "550.1"})

_UNIT_VALIDATORS = {"_duration": "duration", "_span": "duration, 0 = off", "_seconds": "duration",
                    "_interval": "duration, 0 = on demand", "size_rate": "bytes per second",
                    "_listen": "HOST:PORT", "_day": "weekday", "_jump_host": "HOST[:PORT]"}


@dataclass(frozen=True, slots=True)
class Key:
    """One documented key: its TOML path, what it takes, and how a change applies."""

    path: tuple[str, ...]
    type: str
    default: str
    unit: str
    reload: str
    description: str


@dataclass(frozen=True, slots=True)
class Section:
    """One TOML table (``[daemon]``, ``[training.loss]``, ``[[checkpoints.targets]]``)."""

    title: str
    intro: str
    keys: tuple[Key, ...]


def _model_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The model a field holds (unwrapping ``X | None`` and ``list[X]``), and whether it is a list."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            model, many = _model_of(arg)
            if model is not None:
                return model, many
        return None, False
    if origin is typing.Annotated:
        return _model_of(typing.get_args(annotation)[0])
    if origin is list:
        model, _ = _model_of(typing.get_args(annotation)[0])
        return model, model is not None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    return None, False


def _closure_values(func: Any) -> list[Any]:
    return [c.cell_contents for c in (getattr(func, "__closure__", None) or ())]


def _validator_funcs(info: FieldInfo) -> Iterator[Any]:
    for meta in info.metadata:
        if (func := getattr(meta, "func", None)) is not None:
            yield func


def _choices(info: FieldInfo) -> tuple[str, ...]:
    """The values a string key takes, from a ``one_of`` validator or a ``Literal``."""
    for func in _validator_funcs(info):
        if func.__qualname__.startswith("one_of."):
            for value in _closure_values(func):
                if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
                    return value
    if typing.get_origin(info.annotation) is typing.Literal:
        return tuple(str(a) for a in typing.get_args(info.annotation))
    return ()


def _what(info: FieldInfo) -> str:
    """The words a ``matches(...)`` validator uses for what it accepts ("an absolute path")."""
    for func in _validator_funcs(info):
        if func.__qualname__.startswith("matches."):
            for value in _closure_values(func):
                if isinstance(value, str):
                    return value
    return ""


def _bounds(info: FieldInfo) -> str:
    parts = []
    for meta in info.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"), ("max_length", "at most")):
            if (value := getattr(meta, attr, None)) is not None:
                parts.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value}")
    return ", ".join(parts)


def _kind(info: FieldInfo) -> str:
    """A duration, rate, ... when a named validator says so, else the Python type's TOML name."""
    for func in _validator_funcs(info):
        if func.__name__ in _UNIT_VALIDATORS:
            return _UNIT_VALIDATORS[func.__name__]
    ann = info.annotation
    args = [a for a in typing.get_args(ann) if a is not type(None)]
    if typing.get_origin(ann) in (typing.Union, types.UnionType) and len(args) == 1:
        ann = args[0]
    origin = typing.get_origin(ann)
    if origin in (list, tuple):
        return "list"
    if origin is dict or ann is dict:
        return "table"
    names: dict[Any, str] = {bool: "boolean", int: "integer", float: "number", str: "string"}
    return names.get(ann, "string")


def _item_kind(annotation: Any) -> str:
    """``list of strings``, ``list of integers``: what a list key holds."""
    while typing.get_origin(annotation) in (typing.Annotated, typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = args[0]
    item_args = typing.get_args(annotation)
    item = item_args[0] if item_args else None
    while typing.get_origin(item) is typing.Annotated:
        item = typing.get_args(item)[0]
    names: dict[Any, str] = {str: "strings", int: "integers", float: "numbers"}
    return f"list of {names[item]}" if item in names else "list"


def _type_text(info: FieldInfo) -> str:
    kind = _kind(info)
    if kind == "list":
        kind = _item_kind(info.annotation)
    if choices := _choices(info):
        return " | ".join(f'`"{c}"`' for c in choices)
    extra = [x for x in (_what(info), _bounds(info)) if x]
    return f"{kind} ({'; '.join(extra)})" if extra else kind


def _unit(name: str, info: FieldInfo) -> str:
    kind = _kind(info)
    if kind.startswith("duration") or name.endswith("_s") or name in ("min_excess",):
        return "seconds"
    if kind == "bytes per second":
        return "bytes/s"
    if name.endswith("_bytes"):
        return "bytes"
    return ""


def _default_value(info: FieldInfo) -> Any:
    if info.default_factory is not None:
        return info.default_factory()  # type: ignore[call-arg]
    return info.default


def _default_text(info: FieldInfo) -> str:
    value = _default_value(info)
    if value is PydanticUndefined:
        return "required"
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, timedelta):
        return f"`{value.total_seconds():g}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, tuple | list) and all(isinstance(v, str) for v in value):
        return "`[" + ", ".join(f'"{v}"' for v in value) + "]`"
    if isinstance(value, tuple | list | dict) and not value:
        return "`[]`" if isinstance(value, tuple | list) else "`{}`"
    return f"`{value}`"


_FIELD_LINE = re.compile(r"^(\s+)(\w+)\s*:")


def _source_comments(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> its ``#:`` comment block (above it) or its end-of-line comment."""
    try:
        lines = inspect.getsource(model).splitlines()
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    block: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#:"):
            block.append(stripped[2:].strip())
            continue
        m = _FIELD_LINE.match(line)
        if m and m.group(2) in model.model_fields and m.group(2) not in out:
            trailing = line.split("  # ", 1)[1].strip() if "  # " in line else ""
            text = " ".join(block) or trailing
            if text:
                out[m.group(2)] = text
        block = []
    return out


def _toml_name(name: str, info: FieldInfo) -> str:
    return info.alias or name


def _with(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    new = copy.deepcopy(doc)
    node = new
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
    return new


def _candidates(info: FieldInfo) -> Iterator[Any]:
    """Values to try for a key, most likely valid first (none equal to its default)."""
    default = _default_value(info)
    kind = _kind(info)
    if kind == "boolean":
        yield not default
        return
    yield from _choices(info)
    if kind in ("integer", "number") or kind.startswith("duration") or kind == "bytes per second":
        base = default if isinstance(default, int | float) and not isinstance(default, bool) else 1
        for value in (base * 2, base + 1, base / 2, base - 1, 2, 1, 10, 100, "2d", "1h"):
            if kind == "integer" and not isinstance(value, int):
                continue
            yield value
        if kind == "bytes per second":
            yield "200MB"
        if kind.startswith("duration, 0"):
            yield 0
        return
    if kind == "list":
        yield from _LISTS
    elif kind == "table":
        yield from _TABLES
    else:
        yield from _STRINGS


class _ReloadProbe:
    """Decides "live" or "restart" per key by asking :func:`plan_reload` about a real change."""

    def __init__(self) -> None:
        from ..app.reloader import plan_reload
        from ..config.tables import config_from_toml
        from ..errors import ConfigError

        self._load = config_from_toml
        self._plan = plan_reload
        self._error = ConfigError
        self._base = config_from_toml(BASE_DOC, "b300.toml")

    def verdict(self, path: tuple[str, ...], info: FieldInfo) -> str | None:
        """"live" or "restart"; None when no tried value changed the config."""
        for value in _candidates(info):
            try:
                new = self._load(_with(BASE_DOC, path, value), "b300.toml")
            except self._error:
                continue
            if new == self._base:
                continue
            change = self._plan(self._base, new)
            return "restart" if change.needs_restart else "live"
        return None


def _sections(model: type[BaseModel], prefix: tuple[str, ...], title: str,
              probe: _ReloadProbe, inherited: str | None = None) -> Iterator[Section]:
    """``model``'s own keys as one section, then a section per nested table.

    ``inherited``: the verdict of an array of tables (``[[spares.pool]]``), probed as
    the whole array, which its keys share."""
    comments = _source_comments(model)
    keys: list[Key] = []
    nested: list[tuple[str, type[BaseModel], bool]] = []
    for name, info in model.model_fields.items():
        key = _toml_name(name, info)
        sub, many = _model_of(info.annotation)
        if sub is not None:
            nested.append((key, sub, many))
            continue
        path = (*prefix, key)
        verdict = inherited or probe.verdict(path, info)
        keys.append(Key(path, _type_text(info), _default_text(info), _unit(name, info),
                        verdict or "", info.description or comments.get(name, "")))
    keys = _fill_verdicts(keys)
    yield Section(title, clean_docstring(model.__doc__ or ""), tuple(keys))
    for key, sub, many in nested:
        path = (*prefix, key)
        name = ".".join(path)
        if many:
            whole = probe.verdict(path, model.model_fields[_field_name(model, key)])
            yield from _sections(sub, path, f"[[{name}]]", probe, whole or _missing(path))
        else:
            yield from _sections(sub, path, f"[{name}]", probe)


def _field_name(model: type[BaseModel], key: str) -> str:
    return next(n for n, i in model.model_fields.items() if _toml_name(n, i) == key)


def _missing(path: tuple[str, ...]) -> typing.NoReturn:
    raise ValueError(f"no value tried for {'.'.join(path)} changes the config: add one to "
                     "b300.docs_reference.config_ref")


def _fill_verdicts(keys: list[Key]) -> list[Key]:
    """A key no tried value could change alone (one that needs another key set with it)
    applies like the rest of its table when the table agrees on one answer; else the
    generator stops rather than guess."""
    known = {k.reload for k in keys if k.reload}
    if len(known) != 1 and any(not k.reload for k in keys):
        _missing(next(k.path for k in keys if not k.reload))
    fill = next(iter(known), "")
    return [k if k.reload else Key(k.path, k.type, k.default, k.unit, fill, k.description) for k in keys]


def config_sections() -> list[Section]:
    """Every section of the config file, in the order of :class:`ConfigFile`."""
    from ..config.tables import ConfigFile

    probe = _ReloadProbe()
    out: list[Section] = []
    for name, info in ConfigFile.model_fields.items():
        model, _ = _model_of(info.annotation)
        if model is None:
            raise TypeError(f"ConfigFile.{name} is not a table model")
        out.extend(_sections(model, (name,), f"[{name}]", probe))
    return out


def render_config(sections: list[Section]) -> str:
    """The Markdown of ``docs/reference/config.md`` (without the generated-file banner)."""
    lines = [
        "# Configuration reference", "",
        "Every table and key of `/etc/b300/b300.toml`. Types are TOML types; a *duration* is a "
        "number of seconds or a string such as `\"90s\"`, `\"15 min\"`, `\"1.5h\"`, `\"2d\"` "
        "(see [Configuration](../configuration.md)). Defaults of durations are in seconds.", "",
        "**Reload**: `live` means `systemctl reload b300d` (SIGHUP) applies a change to the running "
        "daemon; `restart` means the daemon logs it as \"needs restart\" in its `config.reloaded` event "
        "and keeps the old value until it is restarted. A file that does not validate is refused "
        "whole (`config.refused`), and the old config keeps running.", "",
    ]
    for s in sections:
        lines += [f"## `{s.title}`", ""]
        if s.intro:
            lines += [s.intro, ""]
        if not s.keys:
            continue
        lines += ["| key | type | default | unit | reload | description |", "|---|---|---|---|---|---|"]
        for k in s.keys:
            lines.append(f"| `{k.path[-1]}` | {cell(k.type)} | {cell(k.default)} | {k.unit} | {k.reload} "
                         f"| {cell(k.description)} |")
        lines.append("")
    return "\n".join(lines)
