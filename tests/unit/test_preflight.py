"""The pure parts of ``b300d --check-config``, ``--version`` and ``submit --dry-run``."""

from __future__ import annotations

import time
from importlib import metadata

from b300.app.preflight import (
    Check,
    Status,
    backend_reason,
    exit_code,
    fail,
    listing_root,
    migration_check,
    ok,
    parse_slurm_user,
    run_checks,
    skip,
    trigger_check,
)
from b300.cli.dry_run import DryRun, render
from b300.model import SubmitRequest
from b300.slurm.cli import sbatch_argv
from b300.store.schema_revision import SCHEMA_HEADS
from b300.version import package_version, version_text

KNOWN = {"0001", "0002", "0101", "0301"}


def test_a_line_is_one_line_with_its_status_first() -> None:
    assert ok("state_dir /x: writable").line() == "ok   state_dir /x: writable"
    line = fail("SMTP h:25: login failed:\n535 bad", "check the\npassword").line()
    assert line == "FAIL SMTP h:25: login failed: 535 bad -- check the password"
    assert skip("SSH: none").line().startswith("skip SSH")


def test_exit_code_is_one_only_when_a_check_failed() -> None:
    assert exit_code([ok("a"), skip("b")]) == 0
    assert exit_code([ok("a"), fail("b", "fix")]) == 1
    assert exit_code([]) == 0


def test_migration_at_head_behind_empty_and_ahead() -> None:
    assert migration_check("db", {"0301"}, {"0301"}, KNOWN) == ok("database db: schema at head 0301")
    behind = migration_check("db", {"0002", "0101"}, {"0301"}, KNOWN)
    assert behind.status is Status.OK and "would migrate from 0002,0101 to 0301" in behind.what
    empty = migration_check("db", set(), {"0301"}, KNOWN)
    assert empty.status is Status.OK and "would migrate from an empty database to 0301" in empty.what
    ahead = migration_check("db", {"0999"}, {"0301"}, KNOWN)
    assert ahead.status is Status.FAIL and "0999 is newer than this b300" in ahead.what
    assert "upgrade" in ahead.fix


def test_slurm_user_from_scontrol_show_config() -> None:
    text = "Configuration data as of 2026-01-01T00:00:00\nSlurmctldPort = 6817\nSlurmUser = slurm(64030)\n"
    assert parse_slurm_user(text) == "slurm"
    assert parse_slurm_user("SlurmUser=root(0)") == "root"
    assert parse_slurm_user("SlurmUserX = a\n") is None
    assert parse_slurm_user("") is None


def test_trigger_permission_is_root_or_slurm_user() -> None:
    assert trigger_check("root", 0, None).status is Status.OK
    assert trigger_check("slurm", 64030, "slurm").status is Status.OK
    refused = trigger_check("b300", 990, "slurm")
    assert refused.status is Status.FAIL and "neither root nor SlurmUser (slurm)" in refused.what
    assert "node_trigger = false" in refused.fix
    assert trigger_check("b300", 990, None).status is Status.FAIL


def test_backend_choice_and_why() -> None:
    assert backend_reason("cli", None) == ("cli", "configured")
    assert backend_reason("auto", None)[0] == "pyslurm"
    assert backend_reason("auto", "pyslurm is not installed") == ("cli", "pyslurm is not installed")
    assert backend_reason("pyslurm", "built for 25.11")[0] == "pyslurm"


def test_listing_root_is_the_folder_above_run() -> None:
    assert listing_root("/mnt/offsite/{run}") == "/mnt/offsite"
    assert listing_root("/mnt/offsite/run-{run}/x") == "/mnt/offsite"
    assert listing_root("/{run}") == "/"
    assert listing_root("/mnt/plain") == "/mnt"


def test_run_checks_keeps_order_bounds_time_and_names_a_crash() -> None:
    def slow() -> list[Check]:
        time.sleep(5)
        return [ok("slow")]

    def broken() -> list[Check]:
        raise RuntimeError("boom")

    started = time.monotonic()
    lines = run_checks([("first", 2.0, lambda: [ok("a"), ok("b")]), ("hangs", 0.5, slow),
                        ("broken", 2.0, broken), ("last", 2.0, lambda: [skip("z")])])
    assert time.monotonic() - started < 3.0  # the slow one is not waited for
    assert [c.what for c in lines][:2] == ["a", "b"]
    assert lines[2].status is Status.FAIL and "hangs: no answer within" in lines[2].what
    assert lines[3].status is Status.FAIL and "RuntimeError: boom" in lines[3].what
    assert lines[4] == skip("z")


def test_version_is_the_installed_distribution_and_the_schema_head() -> None:
    assert package_version() == metadata.version("b300-orchestrator")
    first, second = version_text("b300d").splitlines()
    assert first == f"b300d {metadata.version('b300-orchestrator')}"
    assert second == f"state store schema {','.join(sorted(SCHEMA_HEADS))}"


def test_sbatch_argv_is_what_submit_runs() -> None:
    request = SubmitRequest(job_name="b300-r-a1", comment="c", script="#!/bin/bash\n", nodes=2,
                            gpus_per_node=8, partition="batch", excluded_nodes=("gpu01", "gpu02"),
                            requeue=True)
    assert sbatch_argv(request) == ["sbatch", "--parsable", "--job-name=b300-r-a1", "--comment=c",
                                    "--nodes=2", "--gpus-per-node=8", "--partition=batch",
                                    "--exclude=gpu[01-02]", "--requeue"]


def test_dry_run_text_names_exclusions_black_holes_and_resume_point() -> None:
    d = DryRun(spec_path="s.toml", run_id="llama-abc123", argv=("sbatch", "--exclude=gpu02"),
               script="#!/bin/bash\necho hi\n", excluded=(("gpu02", "open drift finding"),),
               dropped=(), black_holes=(("gpu03", ("r1", "r2", "r3")),), checkpoint_dir="/ck",
               resume_from="/ck/step_10")
    text = render(d)
    assert "nothing submitted, nothing recorded" in text
    assert "exclude: gpu02 (open drift finding)" in text
    assert "black-hole nodes: gpu03 (failed runs r1, r2, r3)" in text
    assert "resume point: /ck/step_10 (newest verified checkpoint in /ck" in text
    assert "sbatch command (the script on its stdin): sbatch --exclude=gpu02" in text
    assert text.endswith("#!/bin/bash\necho hi")
    scratch = render(DryRun(spec_path="s", run_id="r", argv=("sbatch",), script="", excluded=(),
                            dropped=(), black_holes=(), checkpoint_dir="/ck", resume_from=None))
    assert "exclude: none" in scratch and "resume point: start from scratch (no verified checkpoint in /ck)" \
        in scratch
    assert d.to_dict()["exclude"] == [{"node": "gpu02", "why": "open drift finding"}]
