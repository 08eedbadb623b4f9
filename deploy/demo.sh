#!/usr/bin/env bash
# The main job, from a fresh Debian machine, as root: bring up the local Slurm
# cluster, start b300d on it with the embedded SQLite store, run a 2-node job
# (8 fake GPUs per node) through it, and show `b300ctl status`. Then a failure drill:
# a small 2-node CPU training job (PyTorch) that checkpoints, one of its nodes crashed
# once it has (`b300ctl drill --method crash`, the crash being `localcluster.sh
# kill-node`), and the result: excluded after X s, training again after Y s, resumed
# at step Z. B300_DEMO_DRILL=0 leaves the drill out.
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
sed -e "s#@STATE@#$DEMO/state#" -e "s#@SLURM_CONF@#$SLURM_CONF#" -e "s#@REPO@#$PWD#g" \
  deploy/examples/demo.toml > "$CONF"
chmod 600 "$CONF"
export B300_CONFIG="$CONF"

if [[ -f "$DEMO/b300d.pid" ]] && kill -0 "$(cat "$DEMO/b300d.pid")" 2>/dev/null; then
  kill -HUP "$(cat "$DEMO/b300d.pid")"  # the config just written ([drill] is taken live)
  echo "demo: b300d already running (pid $(cat "$DEMO/b300d.pid")), config reloaded"
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
[[ "$state" == COMPLETED ]] || { echo "demo: the 2-node job ended $state"; exit 1; }

drill() { # the failure drill on a small training job; its result on one line
  if ! "$PY" -c 'import torch' 2>/dev/null; then
    echo "demo: no drill (PyTorch is not installed for $PY: pip install torch)"
    return 0
  fi
  local run_dir="$DEMO/train-$(date +%s)" spec run step=0
  mkdir -p "$run_dir/ckpt"
  spec="$run_dir/demo-train.toml"
  sed -e "s#@PYTHON@#$("$PY" -c 'import sys; print(sys.executable)')#" -e "s#@REPO@#$PWD#g" -e "s#@RUN@#$run_dir#g" \
    deploy/examples/demo-train.toml > "$spec"
  run=$("$PY" -m b300.cli --json submit "$spec" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["run"]["id"])')
  echo "demo: submitted training run $run (checkpoints in $run_dir/ckpt)"
  # Wait (at most 3 minutes) until it trains past its first checkpoint.
  for _ in $(seq 1 180); do
    step=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["step"])' "$run_dir/progress.json" 2>/dev/null || echo 0)
    compgen -G "$run_dir/ckpt/step_*/.metadata" >/dev/null && ((step >= 7)) && break
    sleep 1
  done
  echo "demo: run $run at step $step with a checkpoint; drilling it: one of its nodes crashed"
  "$PY" -m b300.cli --json drill "$run" --method crash --timeout 5m > "$run_dir/drill.json" || true
  "$PY" - "$run_dir/drill.json" <<'PY'
import json, sys
try:
    rec = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit("demo: the drill gave no record")
s, f = rec.get("started", {}), rec.get("finished") or {}
def sec(key):
    v = f.get(key)
    return "-" if v is None else f"{v:.1f} s"
print(f"demo: drill {rec['drill']} ({s.get('method')} {s.get('node')} at step {s.get('step_at_failure')}): "
      f"excluded after {sec('excluded_s')}, training again after {sec('training_s')}, "
      f"resumed at step {f.get('resume_step', '-')} ({f.get('steps_lost', '-')} steps lost; "
      f"detected after {sec('detect_s')}, resubmitted after {sec('resubmit_s')}, "
      f"allocated after {sec('allocation_s')}); {f.get('outcome', 'not finished')}, node {f.get('returned', '-')}")
sys.exit(0 if f.get("outcome") == "trained again" else 1)
PY
}
if [[ ${B300_DEMO_DRILL:-1} != 0 ]]; then
  drill
fi

echo
echo "demo: try  B300_CONFIG=$CONF b300ctl status   (stop the daemon: deploy/demo.sh stop)"
