#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine, as root:
#   installs Slurm/munge/sshd (apt) and the Python packages (pip), brings up the
#   local Slurm cluster, then runs pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

bash deploy/install-deps.sh
"$PY" -m pip install --quiet --disable-pip-version-check -e '.[test]'
bash deploy/localcluster.sh up
eval "$(bash deploy/localcluster.sh env)"

"$PY" -m ruff check daemon plugins sql tests
"$PY" -m mypy daemon plugins
mkdir -p artifacts
exec "$PY" -m pytest -p no:cacheprovider "$@"
