#!/usr/bin/env bash
# The main job, from a fresh Debian machine, as root: bring up a local Slurm cluster
# whose nodes live in their own network namespaces (its own dir, name and ports, apart
# from the test cluster), start b300d on it with the embedded SQLite store, run a 2-node
# job (8 fake GPUs per node) through it, and show `b300ctl status`. Then a failure drill:
# a small 2-node training job (deploy/examples/light_train.py, standard library only)
# that checkpoints, one of its nodes powered off once it has (`b300ctl drill --method
# crash`, the crash being `localcluster.sh power-off`: the node goes silent), and the
# result: detected after X s by the daemon's own checks, excluded after, training again
# after, resumed at step Z, and what Slurm still said about the node then (SlurmdTimeout
# is 300 s here: the daemon does not wait for Slurm). B300_DEMO_DRILL=0 leaves it out.
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
# The demo cluster: network-namespace mode, SlurmdTimeout 300 s.
export B300_CLUSTER_DIR=${B300_DEMO_CLUSTER_DIR:-/var/tmp/b300-demo-cluster}
export B300_CLUSTER_NAME=${B300_DEMO_CLUSTER_NAME:-b300demo} B300_PORT_BASE=${B300_DEMO_PORT_BASE:-15800}
export B300_NETNS=1 B300_SLURMD_TIMEOUT=300 B300_NODES=4
bash deploy/localcluster.sh up
eval "$(bash deploy/localcluster.sh env)"
CLUSTER_ENV="\"B300_CLUSTER_DIR=$B300_CLUSTER_DIR\", \"B300_CLUSTER_NAME=$B300_CLUSTER_NAME\", \"B300_PORT_BASE=$B300_PORT_BASE\", \"B300_NETNS=1\", \"B300_SLURMD_TIMEOUT=300\", \"B300_NODES=4\""

mkdir -p "$DEMO"
sed -e "s#@STATE@#$DEMO/state#" -e "s#@SLURM_CONF@#$SLURM_CONF#" -e "s#@REPO@#$PWD#g" -e "s#@CLUSTER_ENV@#$CLUSTER_ENV#" \
  deploy/examples/demo.toml > "$CONF"
chmod 600 "$CONF"
export B300_CONFIG="$CONF"

if [[ -f "$DEMO/b300d.pid" ]] && kill -0 "$(cat "$DEMO/b300d.pid")" 2>/dev/null; then
  kill -HUP "$(cat "$DEMO/b300d.pid")"  # the config just written ([drill] is taken live)
  echo "demo: b300d already running (pid $(cat "$DEMO/b300d.pid")), config reloaded"
else
  nohup "$PY" -m b300.app.main --config "$CONF" >>"$DEMO/b300d.log" 2>&1 &
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

slurm_watch() { # file: Slurm's view of every node each second, "epoch node state" lines (bounded)
  local file=$1 now
  for _ in $(seq 1 400); do
    now=$(date +%s.%N)
    timeout 5 sinfo -h -N -o '%N %T' 2>/dev/null | sed "s/^/$now /" >>"$file" || true
    sleep 1
  done
}

drill() { # the failure drill on a small training job; its result on one line
  local run_dir="$DEMO/train-$(date +%s)" spec run step=0 t0 watch
  mkdir -p "$run_dir/ckpt"
  spec="$run_dir/demo-train.toml"
  sed -e "s#@PYTHON@#$(command -v python3)#" -e "s#@REPO@#$PWD#g" -e "s#@RUN@#$run_dir#g" \
    deploy/examples/demo-train.toml > "$spec"
  # The training run an earlier demo left going would compete for the nodes: cancel it first.
  for run in $("$PY" -m b300.cli --json status --all | "$PY" -c 'import json,sys
print(" ".join(r["id"] for r in json.load(sys.stdin)
               if r["name"] == "demo-train" and r["state"] not in ("COMPLETED", "FAILED", "CANCELLED")))'); do
    "$PY" -m b300.cli cancel "$run" >/dev/null && echo "demo: cancelled the earlier demo's training run $run"
  done
  run=$("$PY" -m b300.cli --json submit "$spec" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["run"]["id"])')
  echo "demo: submitted training run $run (checkpoints in $run_dir/ckpt)"
  # Wait (at most 3 minutes) until it trains past its first checkpoint.
  for _ in $(seq 1 180); do
    step=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["step"])' "$run_dir/progress.json" 2>/dev/null || echo 0)
    compgen -G "$run_dir/ckpt/step_*/DONE" >/dev/null && ((step >= 7)) && break
    sleep 1
  done
  echo "demo: run $run at step $step with a checkpoint; drilling it: one of its nodes powered off"
  t0=$(date +%s.%N)
  local t_start=$SECONDS
  slurm_watch "$run_dir/slurm-view.txt" &
  watch=$!
  "$PY" -m b300.cli --json drill "$run" --method crash --timeout 5m > "$run_dir/drill.json" || true
  kill "$watch" 2>/dev/null || true
  wait "$watch" 2>/dev/null || true
  "$PY" - "$run_dir/drill.json" "$t0" "$run_dir/slurm-view.txt" "$((SECONDS - t_start))" <<'PY'
import json, sys
try:
    rec = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit("demo: the drill gave no record")
s, f = rec.get("started", {}), rec.get("finished") or {}
def slurm_said(node, after_s):
    """Slurm's state of the node in the last sample before the drill's start + after_s."""
    said = "-"
    try:
        lines = open(sys.argv[3]).read().splitlines()
    except OSError:
        return said
    for line in lines:
        t, n, state = (line.split() + ["", "", ""])[:3]
        if n == node and float(t) <= float(sys.argv[2]) + after_s:
            said = state
    return said
def sec(key):
    v = f.get(key)
    return "-" if v is None else f"{v:.1f} s"
print(f"demo: drill {rec['drill']} ({s.get('method')} {s.get('node')} at step {s.get('step_at_failure')}): "
      f"detected after {sec('detect_s')} ({f.get('detected_by') or 'by Slurm'}), excluded after {sec('excluded_s')}, "
      f"training again after {sec('training_s')}, resumed at step {f.get('resume_step', '-')} "
      f"({f.get('steps_lost', '-')} steps lost; resubmitted after {sec('resubmit_s')}, "
      f"allocated after {sec('allocation_s')}); {f.get('outcome', 'not finished')}, node {f.get('returned', '-')}; "
      f"drill took {sys.argv[4]} s")
if f.get("training_s") is not None:
    said = slurm_said(s.get("node"), f["training_s"])
    why = ("Slurm had noticed the node by itself" if "down" in said or said.endswith("*") else
           "not DOWN, not even not-responding: with SlurmdTimeout=300 s Slurm had not noticed; "
           "a drain is the daemon's own")
    print(f"demo: when the run trained again, Slurm said node {s.get('node')} was '{said}' ({why})")
sys.exit(0 if f.get("outcome") == "trained again" else 1)
PY
}
if [[ ${B300_DEMO_DRILL:-1} != 0 ]]; then
  drill
fi

echo
echo "demo: try  B300_CONFIG=$CONF b300ctl status   (stop the daemon: deploy/demo.sh stop)"
