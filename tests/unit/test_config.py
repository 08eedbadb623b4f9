"""The daemon's config file: defaults, and one clear line for each mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from b300.config import load_config
from b300.errors import ConfigError


def _write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "b300.toml"
    p.write_text(text)
    return str(p)


def test_defaults(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, "[daemon]\nstate_dir = '/srv/b300'\n"))
    assert cfg.database_url == "sqlite:////srv/b300/state.db"
    assert cfg.socket == "/srv/b300/b300d.sock"
    assert cfg.job_log_dir == "/srv/b300/job-logs"
    assert cfg.poll_interval_s == 15 and cfg.slurm_backend == "auto"


def test_durations_and_backend(tmp_path: Path) -> None:
    cfg = load_config(
        _write(
            tmp_path,
            "[daemon]\npoll_interval = '1.5s'\nmax_backoff = '2m'\n"
            "[slurm]\nbackend = 'cli'\ncommand_timeout = 10\n",
        )
    )
    assert cfg.poll_interval_s == 1.5 and cfg.max_backoff_s == 120
    assert cfg.slurm_backend == "cli" and cfg.slurm_timeout_s == 10


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[daemon]\npoll_intervall = 5\n", "unknown key 'poll_intervall'"),
        ("[daemon]\npoll_interval = 'often'\n", "duration"),
        ("[daemon]\npoll_interval = '0.01s'\n", "between 0.2 s and 1 h"),
        ("[daemon]\nstate_dir = 'relative'\n", "absolute path"),
        ("[daemon]\ndatabase_url = 'mysql://x'\n", "sqlite:/// or postgresql://"),
        ("[daemon]\nlog_format = 'xml'\n", "log_format"),
        ("[slurm]\nbackend = 'rest'\n", "backend must be"),
        ("[daemon\n", "not valid TOML"),
        ("daemon = 3\n", "must be a table"),
        ("[mail]\n", "unknown key 'mail'"),
    ],
)
def test_bad_configs(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, text))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(str(tmp_path / "nope.toml"))
