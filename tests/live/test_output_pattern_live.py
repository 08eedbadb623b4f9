"""The job-log path the daemon reads is the file Slurm really wrote: a batch job with
every filename pattern letter in its --output, on the local cluster."""

from __future__ import annotations

import os
import pwd
import socket
import tempfile
from pathlib import Path

import pytest

from b300.slurm.script import expand_output_pattern
from helpers import slurm_cmd, wait_for

pytestmark = pytest.mark.slurm
PATTERN = "p%%-A%A-a%a-j%j-J%J-N%N-n%n-s%s-t%t-u%u-x%x-w%5j-W%5x-b%b-%3%.out"


def test_expansion_matches_the_file_slurm_writes(slurm_conf: str) -> None:
    logs = Path(tempfile.mkdtemp(prefix="b300-pattern-", dir="/var/tmp"))
    try:
        for pattern in (PATTERN, "e\\%j-%x.out"):
            before = set(os.listdir(logs))
            job_id = int(slurm_cmd(slurm_conf, "sbatch", "--parsable", "--nodes=1", "--job-name=pat-x",
                                   f"--output={logs}/{pattern}", "--wrap=true").strip().split(";")[0])
            new = wait_for(lambda b=before: set(os.listdir(logs)) - b, 60, "the job's output file")
            # Every node of the local cluster is this machine: %N is its short host name.
            assert new == {expand_output_pattern(
                pattern, job_id=job_id, job_name="pat-x", user=pwd.getpwuid(os.geteuid()).pw_name,
                batch_host=socket.gethostname())}
    finally:
        for f in logs.iterdir():
            f.unlink()
        logs.rmdir()
