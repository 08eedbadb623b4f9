"""The batch script and sbatch request for an attempt, against a golden file."""

from __future__ import annotations

import os
from pathlib import Path

from b300.slurm.script import build_request
from b300.spec import parse_spec

GOLDEN = Path(__file__).parent.parent / "golden" / "attempt2.sbatch"

SPEC = parse_spec("""
name = "llama"
[job]
command = "srun python train.py --resume {resume_from} --tag 'x'"
nodes = 2
gpus_per_node = 8
partition = "batch"
[job.environment]
WEIRD = "a b; $(rm -rf /) `x` 'q'"
[checkpoint]
dir = "/ckpt/llama run"
""")


def test_script_matches_golden() -> None:
    req = build_request(
        SPEC,
        run_id="llama-abc123",
        attempt=2,
        resume_from="/ckpt/llama run/step 40",
        excluded_nodes=("gpu03", "gpu01"),
    )
    if os.environ.get("B300_UPDATE_GOLDEN"):
        GOLDEN.write_text(req.script)
    assert req.script == GOLDEN.read_text()
    assert req.job_name == "b300-llama-abc123-a2"
    assert req.excluded_nodes == ("gpu01", "gpu03")
    assert req.comment == "b300 run=llama-abc123 attempt=2 name=llama"


def test_values_stay_words(tmp_path: Path) -> None:
    """Every value the daemon writes into the script reaches bash as data, not code."""
    import subprocess

    req = build_request(SPEC, run_id="llama-abc123", attempt=1, resume_from="/p/$(touch pwned)")
    script = req.script.replace(
        "srun python train.py", 'printf \'%s\\n\' "$WEIRD" "$B300_RESUME_FROM"; echo'
    )
    out = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout
    assert "a b; $(rm -rf /) `x` 'q'" in out and "/p/$(touch pwned)" in out
    assert not (tmp_path / "pwned").exists()
