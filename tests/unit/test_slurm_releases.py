"""The pure parsers on what each tested Slurm release really printed.

tests/fixtures/slurm/<release>/ holds the output of the daemon's own command lines,
recorded by tests/fixtures/slurm/capture.py on a local cluster of that release
(22.05: Debian 12's packages; 24.11: Debian 13's; 26.05: Debian unstable's).
Known differences between them: a NODE_FAIL job's exit code (0:0 on 22.05, 1:0 later),
sacct's reason for a held job (JobHeldUser on 22.05, None later), extra fields in
``scontrol show node``. The parsers must give the same answers on all three.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from b300.errors import SlurmError
from b300.model import SlurmState
from b300.slurm.parse import parse_sacct, parse_sbatch, parse_sinfo, parse_squeue
from b300.slurm.release import (
    SlurmRelease,
    check_release,
    parse_release,
    read_release,
    record_release,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "slurm"
RELEASES = ("22.05", "24.11", "26.05")


def _read(release: str, name: str) -> str:
    return (FIXTURES / release / name).read_text()


def _jobs(release: str) -> dict[str, int]:
    return {k: int(v) for k, v in json.loads(_read(release, "jobs.json")).items()}


def test_every_tested_release_has_fixtures() -> None:
    found = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
    assert found == list(RELEASES)


@pytest.mark.parametrize("release", RELEASES)
def test_version_line(release: str) -> None:
    rel = parse_release(_read(release, "sinfo-V.txt"))
    assert rel.release == release
    assert rel.text.startswith(release + ".")
    check_release(rel)  # every tested release is accepted


@pytest.mark.parametrize("release", RELEASES)
def test_sbatch(release: str) -> None:
    assert parse_sbatch(_read(release, "sbatch-parsable.txt")) == _jobs(release)["done"]


@pytest.mark.parametrize("release", RELEASES)
def test_squeue(release: str) -> None:
    jobs = _jobs(release)
    records, bad = parse_squeue(_read(release, "squeue.txt"))
    assert bad == []
    assert set(records) == set(jobs.values())
    assert records[jobs["running"]].state is SlurmState.RUNNING
    assert records[jobs["running"]].nodes == ("gpu01", "gpu02")
    assert records[jobs["running"]].start is not None and records[jobs["running"]].end is None
    assert records[jobs["held"]].state is SlurmState.PENDING
    assert records[jobs["held"]].nodes == () and records[jobs["held"]].reason == "JobHeldUser"
    assert records[jobs["node_fail"]].state is SlurmState.NODE_FAIL
    assert records[jobs["node_fail"]].nodes == ("gpu04",)
    assert records[jobs["cancelled"]].state is SlurmState.CANCELLED
    assert records[jobs["failed"]].state is SlurmState.FAILED
    assert records[jobs["done"]].state is SlurmState.COMPLETED
    assert all(r.name == "b300-fixture" for r in records.values())


@pytest.mark.parametrize("release", RELEASES)
def test_sacct(release: str) -> None:
    jobs = _jobs(release)
    records, bad = parse_sacct(_read(release, "sacct.txt"))
    assert bad == []
    assert set(records) == set(jobs.values())
    assert (records[jobs["failed"]].state, records[jobs["failed"]].exit_code) == (SlurmState.FAILED, 3)
    assert records[jobs["done"]].state is SlurmState.COMPLETED
    assert records[jobs["done"]].exit_code == 0
    assert records[jobs["cancelled"]].state is SlurmState.CANCELLED  # "CANCELLED by 0"
    assert records[jobs["node_fail"]].state is SlurmState.NODE_FAIL
    assert records[jobs["node_fail"]].nodes == ("gpu04",)
    assert records[jobs["running"]].state is SlurmState.RUNNING
    assert records[jobs["running"]].end is None
    assert records[jobs["held"]].state is SlurmState.PENDING
    assert records[jobs["held"]].nodes == () and records[jobs["held"]].start is None


@pytest.mark.parametrize("release", RELEASES)
def test_sinfo(release: str) -> None:
    nodes, bad = parse_sinfo(_read(release, "sinfo-nodes.txt"))
    assert bad == []
    by_name = {n.name: n for n in nodes}
    assert sorted(by_name) == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert by_name["gpu03"].state.lower().startswith("drain")
    assert by_name["gpu03"].reason == "fixture: drained | by test"  # a | inside the reason
    assert by_name["gpu01"].state.lower() == "mixed"


@pytest.mark.parametrize("release", RELEASES)
def test_strigger_listing(release: str) -> None:
    # CliSlurmClient.ensure_node_down_trigger looks for its program in this listing.
    assert "/bin/true" in _read(release, "strigger-get.txt")
    assert "/bin/true" not in _read(release, "strigger-get-empty.txt")


@pytest.mark.parametrize(("line", "text", "release"), [
    ("slurm-wlm 24.11.5\n", "24.11.5", "24.11"),
    ("slurm 22.05.8", "22.05.8", "22.05"),
    ("slurm 25.11.0-0rc1", "25.11.0-0rc1", "25.11"),
    ("slurm 26.05.5\n", "26.05.5", "26.05"),
])
def test_parse_release_forms(line: str, text: str, release: str) -> None:
    rel = parse_release(line)
    assert (rel.text, rel.release) == (text, release)


@pytest.mark.parametrize("out", ["", "sinfo: error: something\n", "slurm-wlm\n", "slurm 24.11\n",
                                 "slurm 24.11.5; rm -rf /\n"])
def test_parse_release_refuses_other_text(out: str) -> None:
    with pytest.raises(ValueError):
        parse_release(out)


@pytest.mark.parametrize("line", ["slurm 21.08.8", "slurm 20.11.9", "slurm-wlm 22.04.0"])
def test_older_than_oldest_tested_is_refused(line: str) -> None:
    with pytest.raises(SlurmError) as err:
        check_release(parse_release(line))
    assert err.value.exit_code == 3
    msg = str(err.value)
    assert "\n" not in msg and "older than 22.05" in msg and line.split()[1] in msg


def test_release_file_round_trip(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    assert read_release(tmp_path) is None
    record_release(tmp_path, SlurmRelease(24, 11, 5, "24.11.5"), "cli", datetime(2026, 12, 1, tzinfo=UTC))
    assert read_release(tmp_path) == {"version": "24.11.5", "release": "24.11", "backend": "cli",
                                      "checked_at": "2026-12-01T00:00:00+00:00"}
    record_release(tmp_path, None, "pyslurm", datetime(2026, 12, 1, tzinfo=UTC))
    assert read_release(tmp_path)["version"] is None  # type: ignore[index]
