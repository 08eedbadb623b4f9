"""The daemon's config file: defaults, and one clear line for each mistake."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    assert cfg.poll_interval_s == 15 and cfg.slurm_backend == "cli"


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


_KEYS = st.sampled_from(["state_dir", "database_url", "poll_interval", "log_format", "backend",
                         "settle", "blackhole_failures", "check_interval", "signal", "x", "keep_hourly_for",
                         "bandwidth_limit", "webhook_url", "smtp_port", "timezone", "day", "listen", "interval",
                         "known_hosts", "jump_host", "nodes", "roots", "targets"])
_VALUES = st.one_of(st.integers(-5, 10**6), st.booleans(), st.floats(allow_nan=False),
                    st.text(max_size=30), st.just("/abs/path"), st.just("15s"), st.just("2w"),
                    st.just("http://[x"), st.just("127.0.0.1:9300"), st.just("Europe"),
                    st.lists(st.one_of(st.text(max_size=10), st.integers()), max_size=3),
                    st.dictionaries(st.sampled_from(["gpu01", "name", "kind", "path", "host", "port"]),
                                    st.one_of(st.text(max_size=10), st.integers(0, 70000)), max_size=3))
_TABLES = st.sampled_from(["daemon", "slurm", "recovery", "checkpoints", "report", "metrics", "alerts",
                           "drift", "nope"])


def _toml(value: object) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_TABLES, st.dictionaries(_KEYS, _VALUES, max_size=4), max_size=4))
def test_any_config_is_a_config_or_one_config_error(tmp_path_factory: pytest.TempPathFactory,
                                                     doc: dict[str, dict[str, object]]) -> None:
    """Hostile or broken config values end in a Config or one ConfigError line, nothing else."""
    lines = []
    for table, values in doc.items():
        lines.append(f"[{table}]")
        lines += [f"{k} = {_toml(v)}" for k, v in values.items()]
    path = tmp_path_factory.mktemp("cfg") / "b300.toml"
    path.write_text("\n".join(lines) + "\n")
    try:
        load_config(str(path))
    except ConfigError as exc:
        assert "\n" not in str(exc)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_any_text_is_a_config_or_a_config_error(tmp_path_factory: pytest.TempPathFactory,
                                                text: str) -> None:
    path = tmp_path_factory.mktemp("cfg") / "b300.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        load_config(str(path))
    except ConfigError as exc:
        assert "\n" not in str(exc)
