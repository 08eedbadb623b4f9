#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine, as root:
#   installs Slurm/munge/sshd (apt) and the Python packages (pip), brings up the
#   local Slurm cluster, then runs pytest. Extra arguments go to pytest.
#
# Slurm releases (see docs/testing.md, "Tested Slurm releases"):
#   B300_SLURM   the release the main run uses: 22.05 (the host's, default), 24.11, 26.05
#   B300_MATRIX  releases the Slurm-facing subset (B300_MATRIX_TESTS) runs against after
#                the main run, each on a cluster of that release (default "24.11 26.05";
#                B300_MATRIX= runs none). Measured 2026-12-02 on a fresh 2-core machine:
#                24.11 468 s, 26.05 360 s, build of the release's root included.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
MAIN_REL=${B300_SLURM:-22.05}
MATRIX=${B300_MATRIX-24.11 26.05}
# The live tests that talk to Slurm: jobs, recovery (node crash under a 2-node training
# job), outage (slurmctld, slurmdbd), drift drain, upkeep crash, the release check.
# Not the PostgreSQL store test of test_jobs_live: it tests the store, not Slurm.
MATRIX_TESTS=${B300_MATRIX_TESTS:---deselect=tests/live/test_jobs_live.py::test_daemon_on_postgresql tests/live/test_jobs_live.py tests/live/test_recovery_live.py::test_node_failure_drains_and_resumes_from_newest_checkpoint tests/live/test_outage_live.py::test_slurmctld_outage_is_unknown_not_failure tests/live/test_outage_live.py::test_slurmdbd_down_the_controller_view_is_used_after_the_grace tests/drift/test_drift_live.py::test_a_node_with_another_nccl_is_drained_and_returns_when_fixed tests/live/test_upkeep_crash_live.py tests/live/test_slurm_release_live.py}

log() { printf 'test.sh: %s\n' "$*" >&2; }

bash deploy/install-deps.sh
"$PY" -m pip install --quiet --disable-pip-version-check -e '.[test]'

# A release's root stays mounted only while its cluster runs: unmount on any exit.
cleanup() {
  if [[ $MAIN_REL != 22.05 || -n $MATRIX ]]; then
    B300_SLURM=$MAIN_REL bash deploy/localcluster.sh down || true
  fi
}
trap cleanup EXIT

B300_SLURM=$MAIN_REL bash deploy/localcluster.sh up
eval "$(B300_SLURM=$MAIN_REL bash deploy/localcluster.sh env)"
log "main run on $(sinfo -V)"

"$PY" -m ruff check daemon plugins sql tests
PYTHON=$PY bash deploy/typecheck.sh   # b300, b300.plugins, b300.sql as imported
mkdir -p artifacts
"$PY" -m pytest -p no:cacheprovider --durations=40 "$@"

# Every release runs even when an earlier one failed (one CI log shows them all); the
# script fails at the end if any did. The cluster knobs (B300_CLUSTER_DIR, _NAME,
# B300_PORT_BASE, B300_SSHD_PORT_BASE) pass through the environment unchanged.
failed=() summary=()
for rel in $MATRIX; do
  t0=$SECONDS
  log "== Slurm $rel: building/mounting its root and bringing the cluster up"
  rc=0
  B300_SLURM=$rel bash deploy/localcluster.sh up || rc=$?
  if ((rc == 0)); then
    (
      export B300_SLURM=$rel
      eval "$(bash deploy/localcluster.sh env)"
      log "== Slurm $rel: $(sinfo -V) ($(command -v sinfo)), cluster up after $((SECONDS - t0)) s"
      # shellcheck disable=SC2086
      "$PY" -m pytest -p no:cacheprovider -q --durations=10 $MATRIX_TESTS
    ) || rc=$?
  fi
  ((rc == 0)) || failed+=("$rel")
  summary+=("$rel: $( ((rc == 0)) && echo passed || echo "FAILED (exit $rc)") in $((SECONDS - t0)) s")
  log "== Slurm $rel: done in $((SECONDS - t0)) s (exit $rc)"
done
for line in "${summary[@]}"; do log "matrix: $line"; done
((${#failed[@]} == 0)) || { log "matrix: failed on Slurm ${failed[*]}"; exit 1; }
