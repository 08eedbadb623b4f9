#!/usr/bin/env bash
# The main job, from a fresh Debian machine, as root: bring up the local Slurm
# cluster, start b300d on it with the embedded SQLite store, run a 2-node job
# (8 fake GPUs per node) through it, and show `b300ctl status`.
# The daemon keeps running afterwards; `deploy/demo.sh stop` stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEMO=${B300_DEMO_DIR:-/var/tmp/b300-demo}
CONF="$DEMO/b300.toml"

if [[ "${1:-}" == "stop" ]]; then
  if [[ -f "$DEMO/b300d.pid" ]] && kill -0 "$(cat "$DEMO/b300d.pid")" 2>/dev/null; then
    kill -TERM "$(cat "$DEMO/b300d.pid")"
    echo "demo: b300d stopped"
  fi
  exit 0
fi

bash deploy/install-deps.sh
"$PY" -m pip install --quiet --disable-pip-version-check -e .
bash deploy/localcluster.sh up
eval "$(bash deploy/localcluster.sh env)"

mkdir -p "$DEMO"
sed -e "s#@STATE@#$DEMO/state#" -e "s#@SLURM_CONF@#$SLURM_CONF#" \
  deploy/examples/demo.toml > "$CONF"
chmod 600 "$CONF"
export B300_CONFIG="$CONF"

if [[ -f "$DEMO/b300d.pid" ]] && kill -0 "$(cat "$DEMO/b300d.pid")" 2>/dev/null; then
  echo "demo: b300d already running (pid $(cat "$DEMO/b300d.pid"))"
else
  nohup "$PY" -m b300.daemon_main --config "$CONF" >>"$DEMO/b300d.log" 2>&1 &
  echo $! >"$DEMO/b300d.pid"
  for _ in $(seq 1 100); do
    [[ -S "$DEMO/state/b300d.sock" ]] && break
    kill -0 "$(cat "$DEMO/b300d.pid")" || { tail -20 "$DEMO/b300d.log"; exit 1; }
    sleep 0.2
  done
  echo "demo: b300d running (pid $(cat "$DEMO/b300d.pid"), log $DEMO/b300d.log)"
fi

run=$("$PY" -m b300.cli --json submit deploy/examples/demo-job.toml | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["run"]["id"])')
echo "demo: submitted run $run"
for _ in $(seq 1 120); do
  state=$("$PY" -m b300.cli --json status "$run" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["run"]["state"])')
  case "$state" in COMPLETED|FAILED|CANCELLED) break ;; esac
  sleep 1
done
"$PY" -m b300.cli status --all
echo
"$PY" -m b300.cli status "$run"
echo
for log in "$DEMO/state/job-logs/b300-$run-a"*.out; do
  [[ -f "$log" ]] && { echo "demo: the job's output ($log):"; cat "$log"; }
done
echo
echo "demo: try  B300_CONFIG=$CONF b300ctl status   (stop the daemon: deploy/demo.sh stop)"
[[ "$state" == COMPLETED ]]
