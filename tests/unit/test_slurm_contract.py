"""The SlurmClient contract is the whole contract: every method the daemon calls is in
the protocol, every backend and the fencing wrapper define each one on the class (no
pass-through by attribute lookup), and the wrapper fences exactly the changing calls."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from b300.errors import SlurmError
from b300.ha.fence import Fence, FencedSlurm
from b300.ha.lease import DbLease, FencedError
from b300.interfaces import SlurmClient
from b300.model import SubmitRequest
from b300.slurm.cli import CliSlurmClient
from b300.slurm.pyslurm_backend import PyslurmClient
from b300.store import create_engine, open_store

METHODS = sorted(n for n, v in vars(SlurmClient).items() if inspect.isfunction(v) and not n.startswith("_"))
CHANGES = {"submit", "cancel", "drain_node", "down_node", "resume_node", "reboot_node", "exclude_nodes",
           "ensure_node_down_trigger", "create_reservation", "update_reservation",
           "add_reservation_flag", "delete_reservation"}


def test_the_protocol_names_what_the_daemon_uses() -> None:
    assert {"reservation_list", "create_reservation", "delete_reservation", "version", "call_counts",
            "close", "node_addresses", "default_partition"} <= set(METHODS)
    assert set(METHODS) >= CHANGES


@pytest.mark.parametrize("cls", [CliSlurmClient, PyslurmClient, FencedSlurm])
def test_every_implementation_defines_every_method(cls: type) -> None:
    missing = [m for m in METHODS if not inspect.isfunction(getattr(cls, m, None))]
    assert missing == []
    assert "__getattr__" not in vars(cls)  # nothing passes through unseen
    sig = {m: list(inspect.signature(getattr(cls, m)).parameters) for m in METHODS}
    want = {m: list(inspect.signature(getattr(SlurmClient, m)).parameters) for m in METHODS}
    assert sig == want


def _args(name: str) -> tuple[object, ...]:
    return {
        "submit": (SubmitRequest(job_name="x", comment="", script="#!/bin/sh\n", nodes=1, gpus_per_node=0),),
        "cancel": (7,), "drain_node": ("gpu01", "r"), "down_node": ("gpu01", "r"),
        "resume_node": ("gpu01",), "reboot_node": ("gpu01", "r"), "exclude_nodes": (7, ["gpu01"]),
        "ensure_node_down_trigger": ("/x",),
        "create_reservation": ("b300-spares-x", ["gpu01"]), "update_reservation": ("b", ["gpu01"]),
        "add_reservation_flag": ("b", "MAINT"), "delete_reservation": ("b",),
    }[name]


def test_a_standby_reaches_slurm_only_to_read(tmp_path: Path) -> None:
    """A daemon that does not hold the lease: every change is refused before any Slurm
    tool runs; reads go through to the client (here one without tools: SlurmError)."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    open_store(url).close()
    lease = DbLease(create_engine(url, statement_timeout_s=1.0, lock_timeout_s=0.5, connect_timeout_s=2,
                                  pool_size=1), "t", ttl_s=5, call_timeout_s=1.0, identity="standby")
    inner = CliSlurmClient(bin_dir=str(tmp_path / "no-slurm-here"))
    fenced = FencedSlurm(inner, Fence(lease))
    try:
        for name in sorted(CHANGES):
            kwargs = {"users": "b300", "partition": "batch"} if name == "create_reservation" else {}
            with pytest.raises(FencedError):
                getattr(fenced, name)(*_args(name), **kwargs)
        assert inner.call_counts() == {}
        with pytest.raises(SlurmError, match="not found"):
            fenced.nodes()
        assert fenced.call_counts() == {"sinfo": 1}
    finally:
        lease.release()
