"""The pyslurm backend's pure conversions (no worker, no Slurm)."""

from __future__ import annotations

import pytest

from b300.cycle.observe import attempt_state_for
from b300.errors import SlurmError
from b300.model import SlurmState
from b300.recovery.classify import node_is_bad
from b300.slurm.pyslurm_backend import (
    job_environment,
    node_state,
    observation_from_dict,
    release,
    signal_name,
)


@pytest.mark.parametrize(("raw", "state", "flags"), [
    ("IDLE", "IDLE", ()),
    ("IDLE+DRAIN", "DRAINED", ()),
    ("MIXED+DRAIN", "DRAINING", ()),
    ("ALLOCATED+DRAIN", "DRAINING", ()),
    ("IDLE+COMPLETING+DRAIN", "DRAINING", ()),
    ("DOWN+NOT_RESPONDING", "DOWN", ("*",)),
    ("DOWN+DRAIN+NOT_RESPONDING", "DRAINED", ("*",)),
    ("IDLE+CLOUD+POWERED_DOWN", "IDLE", ("~",)),
    ("ALLOCATED+FAIL", "FAILING", ()),
    ("IDLE+FAIL", "FAIL", ()),
    ("MIXED", "MIXED", ()),
    ("", "UNKNOWN", ()),
])
def test_node_state_takes_sinfo_s_form(raw: str, state: str, flags: tuple[str, ...]) -> None:
    assert node_state(raw) == (state, flags)


def test_drained_and_down_nodes_from_pyslurm_are_bad_for_recovery() -> None:
    from datetime import UTC, datetime

    from b300.model import NodeRecord

    for raw in ("IDLE+DRAIN", "MIXED+DRAIN", "DOWN+NOT_RESPONDING"):
        rec = NodeRecord(name="gpu01", state=node_state(raw)[0], reason="", updated_at=datetime.now(UTC))
        assert node_is_bad(rec), raw
    ok = NodeRecord(name="gpu01", state=node_state("MIXED")[0], reason="", updated_at=datetime.now(UTC))
    assert not node_is_bad(ok)


@pytest.mark.parametrize(("given", "name"), [("USR1", "SIGUSR1"), ("SIGUSR1", "SIGUSR1"),
                                             ("usr2", "SIGUSR2"), ("10", "SIGUSR1"), ("TERM", "SIGTERM")])
def test_signal_names_become_the_SIG_form(given: str, name: str) -> None:
    assert signal_name(given) == name


@pytest.mark.parametrize("bad", ["NOPE", "999", "USR1;rm", ""])
def test_bad_signal_names_are_refused(bad: str) -> None:
    with pytest.raises(SlurmError) as err:
        signal_name(bad)
    assert not err.value.transient


def test_job_environment_is_sbatch_s() -> None:
    env = job_environment({"PATH": "/bin", "LC_ALL": "en_US.UTF-8", "SLURM_SUBMIT_DIR": "/old"},
                          submit_dir="/home/u", submit_host="login1", nice=0)
    assert env == {"PATH": "/bin", "LC_ALL": "en_US.UTF-8", "SLURM_SUBMIT_DIR": "/home/u",
                   "SLURM_SUBMIT_HOST": "login1", "SLURM_PRIO_PROCESS": "0"}


def test_observation_reason_none_and_expediting() -> None:
    obs = observation_from_dict({"job_id": 5, "state": "EXPEDITING", "reason": "None"}, "squeue")
    assert obs.state is SlurmState.EXPEDITING and obs.reason == ""
    assert attempt_state_for(obs.state).value == "PENDING"
    with pytest.raises(ValueError):
        observation_from_dict({"job_id": 5, "state": "NO_SUCH_STATE"}, "squeue")


def test_release() -> None:
    assert release("25.11.2") == "25.11" == release("25.11.7")
