"""Job specs: valid ones load, every kind of wrong one is one clear SpecError line."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from b300.errors import SpecError
from b300.spec import dump_spec, load_spec_file, parse_spec

GOOD = """
name = "llama-405b"
[job]
command = "srun python train.py --resume {resume_from}"
nodes = 2
gpus_per_node = 8
partition = "batch"
time_limit = "2-00:00:00"
[job.environment]
NCCL_DEBUG = "WARN"
[checkpoint]
dir = "/lustre/ckpt/llama"
layout = "dcp"
interval = "90m"
[retries]
infra = 5
retryable_exit_codes = [134, 1]
"""


def test_good_spec() -> None:
    spec = parse_spec(GOOD)
    assert spec.name == "llama-405b" and spec.nodes == 2 and spec.gpus_per_node == 8
    assert spec.checkpoint.interval_s == 5400 and spec.checkpoint.layout == "dcp"
    assert spec.retries.retryable_exit_codes == (1, 134)
    assert spec.environment == (("NCCL_DEBUG", "WARN"),)
    assert parse_spec(dump_spec(spec)) == spec


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name = 'x'\n[job]\nnodes = 1\n", "give exactly one of command or script"),
        ("name = 'x'\n[job]\ncommand = 'a'\n", "nodes is missing"),
        ("name = 'x'\n[job]\ncommand = 'a'\nnodes = 'two'\n", "nodes must be an integer"),
        ("name = 'x'\n[job]\ncommand = 'a'\nnodes = true\n", "nodes must be an integer"),
        ("name = 'x'\n[job]\ncommand = 'a'\nnodes = 0\n", "nodes must be >= 1"),
        ("name = 'x'\n[job]\ncommand = 'a'\nnodes = 1\nnodez = 2\n", "unknown key 'nodez'"),
        ("name = 'x y'\n[job]\ncommand = 'a'\nnodes = 1\n",
         "s.toml: name must be a valid name (letters, digits, '.', '_', '-'; at most 64), got 'x y'"),
        (
            "name = 'x'\n[job]\ncommand = 'a'\nnodes = 1\npartition = 'a;rm -rf /'\n",
            "s.toml: [job] partition must be a Slurm partition name, got 'a;rm -rf /'",
        ),
        ("name = 'x'\n[job]\ncommand = 'a'\nnodes = 1\ntime_limit = 'soon'\n", "time limit"),
        (
            "name = 'x'\n[job]\ncommand = 'a'\nnodes = 1\n[job.environment]\nSLURM_X = 'a'\n",
            "reserved prefix",
        ),
        (
            "name = 'x'\n[job]\ncommand = 'a'\nnodes = 1\n[checkpoint]\nlayout = 'zip'\n",
            "[checkpoint] layout must be 'dcp', 'megatron', 'deepspeed', 'hf', 'lightning', 'generic' or "
            "'auto', got 'zip'",
        ),
        (
            "name = 'x'\n[job]\ncommand = 'a'\nnodes = 1\n[checkpoint]\ninterval = '-1h'\n",
            "duration",
        ),
        (
            "name = 'x'\n[job]\ncommand = 'a'\nnodes = 1\n[retries]\nretryable_exit_codes = [0]\n",
            "retryable_exit_codes",
        ),
        (
            "name = 'x'\n[job]\ncommand = 'a'\nnodes = 1\n[checkpoint]\ndir = '/c'\nsignal = 'KILL'\n",
            "signal must be one the job can trap",
        ),
        (
            "name = 'x'\n[job]\ncommand = 'a'\nnodes = 1\n[checkpoint]\ndir = '/c'\nsignal_to = 'all'\n",
            "signal_to needs signal",
        ),
        (
            "name = 'x'\n[job]\ncommand = 'a'\nnodes = 1\n[checkpoint]\ndir = '/c'\nsignal = 'USR1'\n"
            "signal_to = 'steps'\n",
            "[checkpoint] signal_to must be 'batch' or 'all', got 'steps'",
        ),
        (
            "name = 'x'\n[job]\ncommand = 'a'\nnodes = 1\n[checkpoint]\nsignal = 'USR1'\n",
            "signal needs dir",
        ),
        ("name = 'x\n", "not valid TOML"),
        ("[job]\ncommand = 'a'\nnodes = 1\n", "name is missing"),
    ],
)
def test_bad_specs_are_one_line(text: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(text, where="s.toml")
    assert message in str(err.value)
    assert "\n" not in str(err.value) and str(err.value).startswith("s.toml")


def test_checkpoint_signal_is_an_opt_in() -> None:
    """No signal unless the spec says so; SIGUSR2 and usr2 both mean USR2; it round-trips."""
    assert parse_spec(GOOD).checkpoint.signal is None
    text = GOOD.replace('interval = "90m"\n', 'interval = "90m"\nsignal = "SIGusr2"\nsignal_to = "all"\n')
    spec = parse_spec(text)
    assert (spec.checkpoint.signal, spec.checkpoint.signal_to) == ("USR2", "all")
    assert parse_spec(dump_spec(spec)) == spec
    spec = parse_spec(GOOD.replace('interval = "90m"\n', 'interval = "90m"\nsignal = "USR1"\n'))
    assert (spec.checkpoint.signal, spec.checkpoint.signal_to) == ("USR1", "batch")


def test_script_is_inlined(tmp_path: Path) -> None:
    (tmp_path / "train.sbatch").write_text("srun hostname\n")
    (tmp_path / "s.toml").write_text("name = 'x'\n[job]\nscript = 'train.sbatch'\nnodes = 1\n")
    spec, text = load_spec_file(tmp_path / "s.toml")
    assert spec.command == "srun hostname\n"
    assert parse_spec(text) == spec


def test_missing_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read spec"):
        load_spec_file(tmp_path / "nope.toml")
    (tmp_path / "b.toml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(SpecError, match="not UTF-8"):
        load_spec_file(tmp_path / "b.toml")


@given(st.text(max_size=300))
def test_any_text_is_a_spec_or_a_spec_error(text: str) -> None:
    try:
        parse_spec(text)
    except SpecError as exc:
        assert "\n" not in str(exc).strip() or "TOML" in str(exc)
