"""The validation rules every config table and spec table share (issue 13): strict types, unknown
keys refused, one line naming the file, the table and the key; the file's defaults are the records'."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from b300.checkpoints.policy import CheckpointsConfig
from b300.config import Config, RecoveryConfig, load_config
from b300.config.ops import AlertsConfig, MetricsConfig, ReportConfig
from b300.errors import ConfigError, SpecError
from b300.liveness.timing import LivenessConfig
from b300.spec import JobSpec, parse_spec


def _load(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "b300.toml"
    path.write_text(text)
    return load_config(str(path))


def _error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, text)
    message = str(err.value)
    assert "\n" not in message and err.value.exit_code == 2
    return message.removeprefix(f"{tmp_path / 'b300.toml'}: ")


def test_a_file_that_says_nothing_gives_the_records_defaults(tmp_path: Path) -> None:
    """The defaults live twice (table models and records); they must agree."""
    cfg = _load(tmp_path, "[daemon]\nstate_dir = '/srv/b300'\n")
    assert cfg == Config(path=cfg.path, state_dir="/srv/b300", database_url="sqlite:////srv/b300/state.db",
                         socket="/srv/b300/b300d.sock", job_log_dir="/srv/b300/job-logs")
    assert (cfg.recovery, cfg.liveness, cfg.checkpoints, cfg.report, cfg.metrics, cfg.alerts) == (
        RecoveryConfig(), LivenessConfig(), CheckpointsConfig(), ReportConfig(), MetricsConfig(),
        AlertsConfig())
    minimal = "name = 'x'\n[job]\ncommand = 'a'\nnodes = 1\n"
    assert parse_spec(minimal) == JobSpec(name="x", command="a", nodes=1)


def test_the_message_names_the_file_the_table_and_the_key(tmp_path: Path) -> None:
    path = tmp_path / "b300.toml"
    path.write_text("[daemon]\npoll_interval = 'soon'\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    assert str(err.value) == f"{path}: [daemon] poll_interval must be a duration like '1h' or '90m', got 'soon'"


@pytest.mark.parametrize(("text", "message"), [
    # No coercion: a bool is not a number, a string is not a number, a number is not a string.
    ("[recovery]\nblackhole_failures = true\n", "[recovery] blackhole_failures must be an integer, got True"),
    ("[recovery]\nblackhole_failures = '3'\n", "[recovery] blackhole_failures must be an integer, got '3'"),
    ("[recovery]\nblackhole_failures = 3.0\n", "[recovery] blackhole_failures must be an integer, got 3.0"),
    ("[recovery]\nenabled = 1\n", "[recovery] enabled must be true or false, got 1"),
    ("[daemon]\nsubmit_grace = true\n",
     "[daemon] submit_grace must be a duration like '1h' or '90m', got True"),
    ("[slurm]\nconf = 3\n", "[slurm] conf must be a string, got 3"),
    ("[checkpoints]\nroots = '/lustre'\n", "[checkpoints] roots must be an array, got '/lustre'"),
    ("[checkpoints]\nkeep_last = 0\n", "[checkpoints] keep_last must be >= 1, got 0"),
    ("[alerts]\ndrained_burst = 100001\n", "[alerts] drained_burst must be <= 100000, got 100001"),
    ("[slurm]\nbackend = 'rest'\n", "[slurm] backend must be 'auto', 'cli' or 'pyslurm', got 'rest'"),
    ("daemon = 3\n", "[daemon] must be a table, got 3"),
    ("[report]\nto = ['a@example.com', 'nobody']\n", "[report] to[1] must be a mail address, got 'nobody'"),
    ("[daemon]\ndatabase_url = 'mysql://u:secret@h/x'\n",
     "[daemon] database_url must be a sqlite:/// or postgresql:// URL"),  # the URL (a password) is not echoed
    ("[drift]\nknown_hosts = '/k'\n[drift.nodes]\ngpu01 = { host = 'h', port = 0 }\n",
     "[drift] nodes.gpu01.port must be >= 1, got 0"),
    ("[drift]\nknown_hosts = '/k'\n[drift.nodes]\n'gpu 01' = 'h'\n",
     "[drift] nodes key 'gpu 01' is not a node name (letters, digits, '.', '_', '-'; at most 64)"),
    ("[liveness]\ninterval_s = 0.1\n", "[liveness] interval_s must be >= 0.2, got 0.1"),
    ("[liveness]\ninterval_s = 1.0\ntimeout_s = 1.0\n",
     "[liveness] timeout_s (1) must be shorter than interval_s (1): every check of a round ends before "
     "the next"),
    ("[[checkpoints.targets]]\nname = 'a'\nkind = 'filesystem'\npath = '/x'\n",
     "[checkpoints] targets[0] (a): one option (path or prefix) must contain {run}, so that runs do not "
     "overwrite each other's replicas"),
])
def test_strict_types_and_where_the_error_is(tmp_path: Path, text: str, message: str) -> None:
    assert _error(tmp_path, text) == message


def test_an_unknown_key_is_refused_with_the_allowed_ones(tmp_path: Path) -> None:
    assert _error(tmp_path, "[recovery]\nsettel = '1m'\n") == (
        "[recovery] unknown key 'settel' (allowed: blackhole_failures, blackhole_window, enabled, "
        "node_trigger, settle)")
    assert _error(tmp_path, "[mail]\n").startswith("unknown key 'mail' (allowed: alerts, checkpoints, daemon, ")
    # A misspelt required key shows up as the unknown key, not as the missing one.
    assert _error(tmp_path, "[drift]\nknown_host = '/k'\n").startswith("[drift] unknown key 'known_host'")


def test_checks_stricter_than_before(tmp_path: Path) -> None:
    """Values the hand-written validators let through (or crashed on) before issue 13."""
    assert "[drift] interval must be a duration" in _error(
        tmp_path, "[drift]\nknown_hosts = '/k'\ninterval = false\n[drift.nodes]\ngpu01 = 'h'\n")  # was "off"
    assert _error(tmp_path, "[report]\nsmtp_port = 'x'\n") == (  # was ignored without smtp_host
        "[report] smtp_port must be an integer, got 'x'")
    assert _error(tmp_path, "[daemon]\nmax_backoff = nan\n") == "[daemon] max_backoff must be positive, got nan"
    assert "must be at most 999999999 days" in _error(tmp_path, "[slurm]\ncommand_timeout = inf\n")
    # These two were tracebacks (OverflowError, ValueError).
    assert "keep_hourly_for must be at most" in _error(tmp_path, "[checkpoints]\nkeep_hourly_for = inf\n")
    assert _error(tmp_path, "[alerts]\nwebhook_url = 'http://[x'\n") == (
        "[alerts] webhook_url must be an http(s) URL, got 'http://[x'")


def test_what_older_configs_wrote_still_loads(tmp_path: Path) -> None:
    cfg = _load(tmp_path, "[daemon]\nlog_format = ''\nlog_level = ''\n[slurm]\nbackend = ''\n"
                          "[report]\nday = 'Monday'\ntimezone = ''\n[checkpoints]\nkeep_daily_for = '2w'\n"
                          "keep_hourly_for = 0\n")
    assert (cfg.log_format, cfg.log_level, cfg.slurm_backend) == ("auto", "info", "cli")
    assert (cfg.report.day, cfg.report.timezone) == ("mon", "UTC")
    assert cfg.checkpoints.retention.daily_for == timedelta(weeks=2)
    assert cfg.checkpoints.retention.hourly_for == timedelta(0)


@pytest.mark.parametrize(("text", "message"), [
    ("name = 'x'\n[job]\ncommand = 'a'\nnodes = '2'\n", "s.toml: [job] nodes must be an integer, got '2'"),
    ("name = 'x'\n[job]\ncommand = 'a'\nnodes = 1\nrequeue = 'yes'\n",
     "s.toml: [job] requeue must be true or false, got 'yes'"),
    ("name = 'x'\n[job]\ncommand = 'a'\nnodes = 1\n[job.environment]\nA = 1\n",
     "s.toml: [job] environment.A must be a string, got 1"),
    ("name = 'x'\n[job]\ncommand = 'a'\nnodes = 1\n[job.environment]\nB300_RUN_ID = 'x'\n",
     "s.toml: [job] environment key 'B300_RUN_ID' uses a reserved prefix (SLURM_, B300_)"),
    ("name = 'x'\n[job]\ncommand = 'a'\nnodes = 1\n[retries]\nretryable_exit_codes = [1, 256]\n",
     "s.toml: [retries] retryable_exit_codes[1] must be <= 255, got 256"),
    ("name = 'x'\n[job]\ncommand = 'a'\nnodes = 1\n[health]\nhang_timeout = '1w'\nstartup = '1h'\n",
     "s.toml: [health] unknown key 'startup' (allowed: hang_timeout, megatron_log, model_params, "
         "no_restart_exit_codes, progress_file, signals, startup_timeout, tokens_per_sample)"),
    ("name = 'x'\n", "s.toml: [job] table is missing"),
])
def test_spec_errors(text: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(text, where="s.toml")
    assert str(err.value) == message


def test_importing_the_records_does_not_build_the_validators() -> None:
    """b300ctl and most of the daemon only read Config and JobSpec; pydantic (and paramiko, which
    [drift]'s SSH records used to pull in) are loaded when a file is parsed, not at import."""
    code = ("import sys, b300.config, b300.spec, b300.config.ops, b300.checkpoints.policy,"
            " b300.drift.scan_records\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'pydantic', 'pydantic_core', 'paramiko'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
