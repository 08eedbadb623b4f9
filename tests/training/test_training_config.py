"""[training] and the [health] additions: strict models, one-line errors naming the key."""

from __future__ import annotations

import tomllib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from b300.errors import ConfigError, SpecError, UsageError
from b300.training.thresholds import (
    LossSpikeThresholds,
    TrainingConfig,
    load_training_config,
    load_training_spec,
)


def test_defaults() -> None:
    config = load_training_config({})
    assert config == TrainingConfig()
    assert (config.loss.window, config.throughput.below, config.straggler.steps) == (200, 0.7, 10)
    assert config.peak.per_gpu == 2.25e15 and config.enabled


def test_a_whole_table_from_toml() -> None:
    doc = tomllib.loads("""
        [training]
        rate_window = "2m"
        megatron_tz = "Europe/Paris"
        [training.loss]
        window = 500
        mad_k = 6
        [training.throughput]
        below = 0.5
        sustain = "15m"
        baseline = "2h"
        [training.checkpoint_stall]
        timeout = "1h"
        [training.restart_loop]
        attempts = 4
        ignore_outcomes = ["PREEMPTED", "TIMEOUT"]
        [training.peak]
        per_gpu = 2.5e15
        label = "GB300 dense BF16"
    """)
    config = load_training_config(doc["training"])
    assert config.rate_window == 120 and config.loss.window == 500 and config.loss.mad_k == 6.0
    assert config.throughput.sustain == 900 and config.throughput.baseline == 7200
    assert config.checkpoint_stall.timeout == 3600
    assert config.restart_loop.ignore_outcomes == ("PREEMPTED", "TIMEOUT")
    assert config.peak.per_gpu == 2.5e15


@pytest.mark.parametrize(("table", "line"), [
    ({"loss": {"window": True}}, "config: [training] loss.window must be an integer, got True"),
    ({"loss": {"window": "200"}}, "[training] loss.window must be an integer, got '200'"),
    ({"loss": {"window": 3}}, "[training] loss.window must be >= 10, got 3"),
    ({"loss": {"window": 20, "min_points": 30}}, "[training] loss min_points (30) must not exceed window (20)"),
    ({"loss": {"windw": 20}}, "[training] loss unknown key 'windw' (allowed: mad_k, min_points"),
    ({"throughput": {"sustain": "soon"}}, "[training] throughput.sustain must be a duration like 90, '90s'"),
    ({"throughput": {"sustain": -5}}, "[training] throughput.sustain must be a duration"),
    ({"throughput": {"below": 1.5}}, "[training] throughput.below must be < 1.0, got 1.5"),
    ({"megatron_tz": "Mars/Olympus"}, "[training] megatron_tz unknown time zone 'Mars/Olympus'"),
    ({"peak": {"per_gpu": "2.25e15"}}, "[training] peak.per_gpu must be a number, got '2.25e15'"),
    ({"loss": 5}, "[training] loss must be a table, got 5"),
])
def test_bad_config_is_one_line_naming_the_key(table: dict[str, object], line: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_training_config(table)
    assert line in str(err.value) and "\n" not in str(err.value)
    assert err.value.exit_code == 2


def test_the_spec_additions() -> None:
    health = tomllib.loads("""
        [health]
        progress_file = "/lustre/run/progress.{host}.jsonl"
        hang_timeout = "30m"
        megatron_log = true
        model_params = 8_000_000_000
        tokens_per_sample = 4096
        no_restart_exit_codes = [3, 2, 3]
        [health.signals.loss]
        mad_k = 12
        [health.signals.straggler]
        steps = 30
    """)["health"]
    spec = load_training_spec(health)
    assert spec.megatron_log and spec.model_params == 8_000_000_000 and spec.tokens_per_sample == 4096
    assert spec.no_restart_exit_codes == (2, 3)
    run = TrainingConfig(loss=LossSpikeThresholds(window=400)).for_run(spec)
    assert (run.loss.mad_k, run.loss.window, run.loss.min_rise) == (12.0, 400, 0.10)
    assert run.straggler.steps == 30 and run.straggler.ratio == 1.3
    assert run.throughput == TrainingConfig().throughput
    assert spec.conflicts_with_retryable((3, 134)) == ("exit code 3 is in both retryable_exit_codes and "
                                                        "no_restart_exit_codes")
    assert spec.conflicts_with_retryable((134,)) is None


def test_an_override_is_checked_against_the_daemons_other_keys() -> None:
    spec = load_training_spec({"signals": {"loss": {"min_points": 100}}})
    with pytest.raises(ValidationError, match="min_points"):
        TrainingConfig(loss=LossSpikeThresholds(window=60, min_points=50)).for_run(spec)


@pytest.mark.parametrize(("health", "line"), [
    ({"no_restart_exit_codes": [0]}, "[health] no_restart_exit_codes[0] must be >= 1, got 0"),
    ({"no_restart_exit_codes": [True]}, "[health] no_restart_exit_codes[0] must be an integer, got True"),
    ({"no_restart_exit_codes": 3}, "[health] no_restart_exit_codes must be an array, got 3"),
    ({"model_params": 8.0e9}, "[health] model_params must be an integer, got 8000000000.0"),
    ({"megatron_log": "yes"}, "[health] megatron_log must be true or false, got 'yes'"),
    ({"signals": {"los": {}}}, "[health] signals unknown key 'los'"),
])
def test_bad_spec_additions_are_one_line(health: dict[str, object], line: str) -> None:
    with pytest.raises(SpecError) as err:
        load_training_spec(health, where="job.toml")
    assert str(err.value).startswith("job.toml: [health] ") and line in str(err.value)


def test_models_are_frozen() -> None:
    config = TrainingConfig()
    with pytest.raises(ValidationError):
        config.loss.window = 5  # type: ignore[misc]


_values = st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats() | st.text(max_size=20)
_tables = st.recursive(_values, lambda inner: st.dictionaries(st.text(max_size=12), inner, max_size=5),
                       max_leaves=12)


# Generating nested tables is slow on a loaded 2-core machine; the check is what matters.
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["loss", "throughput", "straggler", "checkpoint_stall",
                                         "restart_loop", "peak", "rate_window", "megatron_tz",
                                         "enabled", "backfill_bytes", "junk"]), _tables, max_size=6))
def test_any_table_is_a_config_or_one_line(table: dict[str, object]) -> None:
    for load in (load_training_config, load_training_spec):
        try:
            load(table)
        except UsageError as exc:
            assert "\n" not in str(exc) and len(str(exc)) < 400
