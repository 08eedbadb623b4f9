"""A stand-in for the ``pyslurm`` module, generated from pyslurm's own Cython sources.

No Slurm 25.11 can run here, so pyslurm cannot be imported. This module reads
the sdist of pyslurm 25.11.2 (``tests/fixtures/pyslurm-25.11.2.tar.gz``, as
``pip download --no-deps --no-binary :all: 'pyslurm==25.11.*'`` fetches it)
and builds, for each class the backend touches, a class that has exactly the
members the source declares:

- ``cdef public`` attributes of the ``.pxd`` and ``@property`` getters (and
  ``@x.setter`` setters) and ``def`` methods of the ``.pyx``, base classes
  included (``Jobs(MultiClusterMap)``);
- a method accepts only the parameters its ``def`` line names;
- ``JobSubmitDescription(**kw)`` / ``db.JobFilter(**kw)`` only ``cdef public``
  names (Cython raises AttributeError for others); ``Node(**kw)`` only
  properties with a setter (``Node.__setattr__`` looks the descriptor up);
- ``Job.send_signal`` takes what pyslurm's ``signal_to_num`` takes
  (``signal.Signals[name]``, so ``SIGUSR1`` but not ``USR1``), and ``steps``
  one of the three values its docstring lists; ``Node.state`` accepts what
  ``_node_state_from_str`` accepts (read from pyslurm/core/node.pyx).

Objects that pyslurm returns (``Jobs.load()``, ``db.Jobs.load()``,
``Nodes.load()``, ``slurmctld.Config.load()``) are built from *recorded
values*: dicts whose keys must be members of that class in the source; reading
a member that was not recorded fails the test instead of guessing. Every call
that changes something is appended to ``journal``.
"""

from __future__ import annotations

import hashlib
import json
import re
import signal as _signal
import tarfile
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SDIST = Path(__file__).parent / "fixtures" / "pyslurm-25.11.2.tar.gz"
SDIST_SHA256 = "6e0e4bc639ea3177591b102b77c1dd8df55a9e411ac42ef339a4adb3908cca34"
_ROOT = "pyslurm-25.11.2/pyslurm/"

#: The classes the backend uses: public name -> (source file without suffix, class name).
CLASSES = {
    "Job": ("core/job/job", "Job"),
    "Jobs": ("core/job/job", "Jobs"),
    "JobSubmitDescription": ("core/job/submission", "JobSubmitDescription"),
    "Node": ("core/node", "Node"),
    "Nodes": ("core/node", "Nodes"),
    "Partition": ("core/partition", "Partition"),
    "Partitions": ("core/partition", "Partitions"),
    "db.Job": ("db/job", "Job"),
    "db.Jobs": ("db/job", "Jobs"),
    "db.JobFilter": ("db/job", "JobFilter"),
    "slurmctld.Config": ("core/slurmctld/config", "Config"),
    "MultiClusterMap": ("xcollections", "MultiClusterMap"),
}
#: Where each public name is exported from (the package's ``__init__.py`` files).
EXPORTS = {
    "Job": "__init__.py", "Jobs": "__init__.py", "JobSubmitDescription": "__init__.py",
    "Node": "__init__.py", "Nodes": "__init__.py", "RPCError": "__init__.py",
    "Partition": "__init__.py", "Partitions": "__init__.py",
    "db.Job": "db/__init__.py", "db.Jobs": "db/__init__.py", "db.JobFilter": "db/__init__.py",
    "slurmctld.Config": "core/slurmctld/__init__.py",
}


def read_sources(path: Path = SDIST) -> dict[str, str]:
    """The ``.pyx``, ``.pxd`` and ``.py`` files of pyslurm's sdist, by path under ``pyslurm/``.

    Fails (does not skip) when the sdist is missing or not the one checked.
    """
    if not path.exists():
        raise AssertionError(
            f"{path} is missing: fetch it with `pip download --no-deps --no-binary :all: "
            f"'pyslurm==25.11.2' -d {path.parent}`")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise AssertionError(f"{path} has sha256 {digest}, expected {SDIST_SHA256}")
    out: dict[str, str] = {}
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            name = member.name
            if name.startswith(_ROOT) and name.endswith((".pyx", ".pxd", ".py")):
                f = tar.extractfile(member)
                if f is not None:
                    out[name[len(_ROOT):]] = f.read().decode()
    return out


@dataclass
class ClassSpec:
    """The Python-visible members of one class in pyslurm's source."""

    name: str
    base: str | None = None
    public: set[str] = field(default_factory=set)
    properties: set[str] = field(default_factory=set)
    setters: set[str] = field(default_factory=set)
    methods: dict[str, list[str]] = field(default_factory=dict)  # name -> parameter names

    def merged(self, base: ClassSpec) -> ClassSpec:
        return ClassSpec(self.name, base.base, self.public | base.public,
                         self.properties | base.properties, self.setters | base.setters,
                         {**base.methods, **self.methods})

    @property
    def readable(self) -> set[str]:
        return self.public | self.properties | set(self.methods)


def _blocks(text: str) -> dict[str, tuple[str | None, str]]:
    """Top-level class bodies of a Cython file: name -> (base, body)."""
    out: dict[str, tuple[str | None, str]] = {}
    heads = list(re.finditer(r"^(?:cdef )?class (\w+)(?:\((\w+)\))?:", text, re.M))
    for m in heads:
        rest = text[m.end():]
        end = re.search(r"^(?=[^\s#])", rest, re.M)
        out[m.group(1)] = (m.group(2), rest[:end.start()] if end else rest)
    return out


def _params(sig: str) -> list[str]:
    names = []
    for part in sig.split(","):
        part = part.split("=", 1)[0].strip()
        if not part:
            continue
        names.append(part.split()[-1].lstrip("*") if not part.startswith("*") else part)
    return [n for n in names if n not in ("self", "cls")]


def parse_class(sources: Mapping[str, str], module: str, cls: str) -> ClassSpec:
    pyx = sources.get(f"{module}.pyx", "")
    pxd = sources.get(f"{module}.pxd", "")
    spec = ClassSpec(cls)
    found = False
    for text in (pxd, pyx):
        block = _blocks(text).get(cls)
        if block is None:
            continue
        found = True
        spec.base = spec.base or block[0]
        body = block[1]
        for m in re.finditer(r"^    cdef (?:public|readonly):\n((?:        .*\n|\s*\n)+)", body, re.M):
            spec.public |= {ln.split()[-1] for ln in m.group(1).splitlines() if ln.strip()}
        for m in re.finditer(r"^    cdef (?:public|readonly) (?:\w+ )?(\w+)\s*$", body, re.M):
            spec.public.add(m.group(1))
        for m in re.finditer(r"^    ((?:@[\w.]+\s*\n    )*)(def|cpdef|cdef) (\w+)\((.*?)\)\s*:", body,
                             re.M | re.S):
            decorators, keyword, name, sig = m.group(1), m.group(2), m.group(3), m.group(4)
            if keyword == "cdef":
                continue  # not visible from Python
            if "@property" in decorators:
                spec.properties.add(name)
            elif ".setter" in decorators:
                spec.setters.add(name)
            else:
                spec.methods[name] = _params(sig)
    if not found:
        raise AssertionError(f"class {cls} not found in pyslurm/{module}.pyx/.pxd")
    return spec


def load_specs(sources: Mapping[str, str]) -> dict[str, ClassSpec]:
    specs: dict[str, ClassSpec] = {}
    for public, (module, cls) in CLASSES.items():
        specs[public] = parse_class(sources, module, cls)
    for public, spec in specs.items():
        if spec.base == "MultiClusterMap" and public != "MultiClusterMap":
            specs[public] = spec.merged(specs["MultiClusterMap"])
    return specs


def exported(sources: Mapping[str, str], public: str) -> bool:
    """Whether ``public`` (``db.JobFilter``) is importable under that name from pyslurm."""
    name = public.rsplit(".", 1)[-1]
    return re.search(rf"\b{re.escape(name)}\b", sources[EXPORTS[public]]) is not None


def version(sources: Mapping[str, str]) -> str:
    m = re.search(r'__version__ = "([^"]+)"', sources["version.py"])
    assert m, "no __version__ in pyslurm/version.py"
    return m.group(1)


def node_states(sources: Mapping[str, str]) -> set[str]:
    """The strings ``Node.state = ...`` accepts (``_node_state_from_str`` in core/node.pyx)."""
    m = re.search(r"def _node_state_from_str\(.*?\n(.*?)(?:\n(?=\S)|\Z)", sources["core/node.pyx"], re.S)
    assert m, "_node_state_from_str not found in pyslurm/core/node.pyx"
    return set(re.findall(r'ustate == "(\w+)"', m.group(1)))


class ContractError(AssertionError):
    """The backend used something pyslurm's source does not have."""


class StandIn:
    """A generated ``pyslurm`` module over recorded values (see the module docstring).

    ``records`` maps ``"jobs"``, ``"db_jobs"``, ``"nodes"`` and ``"config"`` to
    recorded objects; ``errors`` maps an operation (``"Jobs.load"``,
    ``"db.Jobs.load"``, ``"submit"``, ...) to the message of the
    ``pyslurm.RPCError`` it raises; ``journal`` gets one tuple per call that
    changes something.
    """

    def __init__(self, state_file: Path, sources: Mapping[str, str] | None = None) -> None:
        self.state_file = state_file
        self.journal_file = state_file.with_suffix(".journal")
        self.sources = sources if sources is not None else read_sources()
        self.specs = load_specs(self.sources)
        self.node_states = node_states(self.sources)
        self.module = self._build()

    # The test writes the state file; the worker process reads it at each call.
    @property
    def records(self) -> dict[str, Any]:
        return dict(json.loads(self.state_file.read_text()).get("records", {}))

    @property
    def errors(self) -> dict[str, str]:
        return dict(json.loads(self.state_file.read_text()).get("errors", {}))

    def log(self, *entry: Any) -> None:
        with self.journal_file.open("a") as f:
            f.write(json.dumps(list(entry)) + "\n")

    def journal(self) -> list[list[Any]]:
        if not self.journal_file.exists():
            return []
        return [json.loads(line) for line in self.journal_file.read_text().splitlines()]

    # -- building ---------------------------------------------------------

    def _check_call(self, public: str, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        spec = self.specs[public]
        if method not in spec.methods:
            raise ContractError(f"pyslurm.{public} has no method {method}()")
        params = spec.methods[method]
        named = [p for p in params if not p.startswith("*")]
        if len(args) > len(named) and not any(p.startswith("*") and not p.startswith("**")
                                                for p in params):
            raise ContractError(f"pyslurm.{public}.{method}() takes {len(named)} arguments, got {len(args)}")
        for k in kwargs:
            if k not in named and not any(p.startswith("**") for p in params):
                raise ContractError(f"pyslurm.{public}.{method}() has no parameter {k!r}")

    def _record(self, public: str, values: Mapping[str, Any]) -> Any:
        spec = self.specs[public]
        for key in values:
            if key not in spec.readable:
                raise ContractError(f"recorded value {key!r} is not a member of pyslurm.{public}")
        outer = self

        class Recorded:
            __slots__ = ()

            def __getattr__(self, name: str) -> Any:
                if name not in spec.readable:
                    raise ContractError(f"pyslurm.{public} has no attribute {name!r}")
                if name in spec.methods:
                    raise ContractError(f"pyslurm.{public}.{name} of a recorded object was not expected")
                if name not in values:
                    raise AssertionError(f"no recorded value for pyslurm.{public}.{name}")
                return values[name]

            def __repr__(self) -> str:
                return f"pyslurm.{public}(recorded)"

        del outer
        return Recorded()

    def _collection(self, public: str, items: Iterable[Any]) -> Any:
        objs = list(items)
        check = self._check_call

        class Collection:
            def values(self) -> list[Any]:
                check(public, "values", (), {})
                return objs

        return Collection()

    def _raise(self, op: str) -> None:
        if op in self.errors:
            raise self.module.RPCError(self.errors[op])

    def _build(self) -> types.ModuleType:
        st = self
        ps = types.ModuleType("pyslurm")
        ps.__version__ = version(self.sources)  # type: ignore[attr-defined]

        class PyslurmError(Exception):
            pass

        class RPCError(PyslurmError):
            pass

        ps.PyslurmError, ps.RPCError = PyslurmError, RPCError  # type: ignore[attr-defined]

        def settable(public: str, name: str, how: str) -> None:
            spec = st.specs[public]
            ok = name in spec.public if how == "public" else name in spec.setters
            if not ok:
                raise ContractError(f"pyslurm.{public} has no settable attribute {name!r}")

        class JobSubmitDescription:
            def __init__(self, **kwargs: Any) -> None:
                for k, v in kwargs.items():
                    setattr(self, k, v)

            def __setattr__(self, name: str, value: Any) -> None:
                settable("JobSubmitDescription", name, "public")
                object.__setattr__(self, name, value)

            def submit(self) -> int:
                st._check_call("JobSubmitDescription", "submit", (), {})
                # _validate_batch_script (core/job/submission.pyx) on a script given as text
                script = str(self.__dict__.get("script") or "")
                if not script.startswith("#!") or "\0" in script or "\r\n" in script:
                    raise ValueError("Not a valid Batch script.")
                st._raise("submit")
                st.log("submit", dict(self.__dict__))
                return 1000 + sum(1 for e in st.journal() if e[0] == "submit")

        class Job:
            def __init__(self, job_id: int) -> None:
                st._check_call("Job", "__init__", (job_id,), {})
                self.id = job_id

            def send_signal(self, signal: Any, steps: str = "children", hurry: bool = False) -> None:
                st._check_call("Job", "send_signal", (signal,), {"steps": steps, "hurry": hurry})
                # pyslurm/utils/helpers.pyx signal_to_num
                try:
                    num = (_signal.Signals(int(signal)) if str(signal).isnumeric()
                           else _signal.Signals[signal]).value
                except Exception:
                    raise ValueError(f"Invalid Signal: {signal}.") from None
                if steps.casefold() not in ("all", "batch", "children"):
                    raise ContractError(f"send_signal steps={steps!r} is not all, batch or children")
                st._raise("send_signal")
                st.log("send_signal", self.id, num, steps)

            def cancel(self) -> None:
                st._check_call("Job", "cancel", (), {})
                st._raise("cancel")
                st.log("cancel", self.id)

            def modify(self, changes: Any) -> None:
                st._check_call("Job", "modify", (changes,), {})
                if not isinstance(changes, JobSubmitDescription):
                    raise TypeError("Job.modify takes a JobSubmitDescription")
                st._raise("modify")
                st.log("modify_job", self.id, dict(changes.__dict__))

        class Jobs:
            @staticmethod
            def load(*args: Any, **kwargs: Any) -> Any:
                st._check_call("Jobs", "load", args, kwargs)
                st._raise("Jobs.load")
                return st._collection("Jobs", (st._record("Job", r) for r in st.records["jobs"]))

        class Node:
            def __init__(self, name: Any = None, **kwargs: Any) -> None:
                object.__setattr__(self, "_changes", {})
                object.__setattr__(self, "name", name)
                for k, v in kwargs.items():
                    setattr(self, k, v)

            def __setattr__(self, name: str, value: Any) -> None:
                settable("Node", name, "setter")
                if name == "state" and value and str(value).upper() not in st.node_states:
                    raise ValueError(f"Invalid Node state: {value}")
                self._changes[name] = value

            def modify(self, changes: Any) -> None:
                st._check_call("Node", "modify", (changes,), {})
                if not isinstance(changes, Node):
                    raise TypeError("Node.modify takes a Node")
                st._raise("Node.modify")
                st.log("modify_node", self.name, dict(changes._changes))

        class Nodes:
            @staticmethod
            def load(*args: Any, **kwargs: Any) -> Any:
                st._check_call("Nodes", "load", args, kwargs)
                st._raise("Nodes.load")
                return st._collection("Nodes", (st._record("Node", r) for r in st.records["nodes"]))

        ps.JobSubmitDescription, ps.Job, ps.Jobs = JobSubmitDescription, Job, Jobs  # type: ignore[attr-defined]
        ps.Node, ps.Nodes = Node, Nodes  # type: ignore[attr-defined]

        class Partitions:
            @staticmethod
            def load(*args: Any, **kwargs: Any) -> Any:
                st._check_call("Partitions", "load", args, kwargs)
                st._raise("Partitions.load")
                return st._collection("Partitions", (st._record("Partition", r)
                                                     for r in st.records.get("partitions", [])))

        ps.Partitions = Partitions  # type: ignore[attr-defined]

        db = types.ModuleType("pyslurm.db")

        class JobFilter:
            def __init__(self, **kwargs: Any) -> None:
                for k, v in kwargs.items():
                    setattr(self, k, v)

            def __setattr__(self, name: str, value: Any) -> None:
                settable("db.JobFilter", name, "public")
                object.__setattr__(self, name, value)

        class DbJobs:
            @staticmethod
            def load(*args: Any, **kwargs: Any) -> Any:
                st._check_call("db.Jobs", "load", args, kwargs)
                flt = args[0] if args else kwargs.get("db_filter")
                if flt is not None and not isinstance(flt, JobFilter):
                    raise TypeError("db.Jobs.load takes a db.JobFilter")
                st._raise("db.Jobs.load")
                st.log("db.Jobs.load", dict(flt.__dict__) if flt is not None else {})
                rows = [r for r in st.records["db_jobs"] if _matches(r, flt)]
                return st._collection("db.Jobs", (st._record("db.Job", r) for r in rows))

        db.JobFilter, db.Jobs = JobFilter, DbJobs  # type: ignore[attr-defined]
        ps.db = db  # type: ignore[attr-defined]

        ctld = types.ModuleType("pyslurm.slurmctld")

        class Config:
            @staticmethod
            def load(*args: Any, **kwargs: Any) -> Any:
                st._check_call("slurmctld.Config", "load", args, kwargs)
                st._raise("slurmctld.Config.load")
                return st._record("slurmctld.Config", st.records["config"])

        ctld.Config = Config  # type: ignore[attr-defined]
        ps.slurmctld = ctld  # type: ignore[attr-defined]
        return ps


def _matches(row: Mapping[str, Any], flt: Any) -> bool:
    """What slurmdbd does with a JobFilter's ids, names and start_time (sacct's -j, --name, -S)."""
    if flt is None:
        return True
    f = flt.__dict__
    if f.get("ids") and row.get("id") not in set(f["ids"]):
        return False
    if f.get("names") and row.get("name") not in set(f["names"]):
        return False
    start = f.get("start_time")
    if not start:
        raise AssertionError("db.JobFilter without start_time: slurmdbd would search from midnight")
    end = row.get("end_time")
    # slurmdbd keeps a job that was running at or after the window's start.
    return not (end and int(end) < int(start))


def call_op(standin: StandIn, fn: Callable[..., Any], *args: Any) -> Any:
    """Run one of the backend's ``_op_*`` functions against the stand-in."""
    return fn(standin.module, *args)


BOUNDARY = Path(__file__).parent / "pyslurm_boundary"


class Boundary:
    """What a test holds to drive the real :class:`PyslurmClient` worker over the stand-in.

    :func:`install` puts ``tests/pyslurm_boundary`` (whose ``pyslurm`` package is
    the stand-in) first on ``sys.path`` (spawned workers inherit it) and names
    the state file in the environment; ``set`` writes the recorded values and
    errors; ``journal`` reads back what the worker did.
    """

    def __init__(self, state_file: Path) -> None:
        self.state_file = state_file
        self.set()

    def set(self, *, jobs: Iterable[Mapping[str, Any]] = (), db_jobs: Iterable[Mapping[str, Any]] = (),
            nodes: Iterable[Mapping[str, Any]] = (), config: Mapping[str, Any] | None = None,
            errors: Mapping[str, str] | None = None,
            partitions: Iterable[Mapping[str, Any]] = ()) -> None:
        self.state_file.write_text(json.dumps({
            "records": {"jobs": list(jobs), "db_jobs": list(db_jobs), "nodes": list(nodes),
                        "partitions": list(partitions),
                        "config": dict(config or {"version": "25.11.7"})},
            "errors": dict(errors or {}),
        }))

    def journal(self) -> list[list[Any]]:
        path = self.state_file.with_suffix(".journal")
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def clear_journal(self) -> None:
        self.state_file.with_suffix(".journal").unlink(missing_ok=True)


def install(monkeypatch: Any, tmp_path: Path) -> Boundary:
    monkeypatch.syspath_prepend(str(BOUNDARY))
    state = tmp_path / "pyslurm-state.json"
    monkeypatch.setenv("B300_PYSLURM_STATE", str(state))
    return Boundary(state)
