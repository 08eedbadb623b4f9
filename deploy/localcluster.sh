#!/usr/bin/env bash
# A real multi-node Slurm cluster on this one machine, for tests and the demo.
#
#   localcluster.sh up | down | status | env | restart-node NODE | kill-node NODE | freeze-node NODE
#   localcluster.sh power-off NODE | power-on NODE | netem NODE ARGS... | partition NODE... | heal
#   localcluster.sh login-link down|up                (the last five need B300_NETNS=1)
#
# Everything (config, logs, spool, state, pid files) lives in
# ${B300_CLUSTER_DIR:-/var/tmp/b300-cluster}; nothing is written to /etc/slurm.
# Clients find the cluster through SLURM_CONF (see `localcluster.sh env`).
#
# Environment knobs:
#   B300_CLUSTER_DIR   state dir (default /var/tmp/b300-cluster)
#   B300_NODES         number of nodes gpu01..gpuNN (default 4, max 99)
#   B300_FAKE_GPUS     1: every node has GRES gpu:8 without devices (default), 0: no GRES
#   B300_MIN_JOB_AGE   slurm.conf MinJobAge (default 300)
#   B300_MAX_JOB_COUNT slurm.conf MaxJobCount (default 30000)
#   B300_DB_HOST/B300_DB_PORT/B300_DB_USER/B300_DB_PASS  MariaDB for slurmdbd
#                      (default 127.0.0.1 / 3306 / root / empty)
#   B300_CLUSTER_NAME  Slurm ClusterName (default b300local); its accounting database
#                      is b300_slurm_acct for the default name, b300_acct_NAME otherwise
#   B300_PORT_BASE     ports: slurmctld BASE+17, slurmdbd BASE+19, slurmd gpuNN BASE+100+NN
#                      (default 16800). Two clusters on one machine need two DIRs, two
#                      names and two port bases.
#   B300_SLURM         the Slurm release: 22.05 (the host's packages, default), 24.11 or
#                      26.05 (Debian 13 / unstable packages, built once into a cache and
#                      mounted at DIR/root by deploy/slurm-release.sh; the daemons run
#                      chrooted there). For those, `env` also puts DIR/bin, wrappers that
#                      run that release's client commands, first in PATH, and state,
#                      spool and accounting database are the release's own.
#   B300_SLURMD_TIMEOUT slurm.conf SlurmdTimeout (default 20)
#   B300_EXPEDITED_REQUEUE 1: SlurmctldParameters=enable_expedited_requeue (26.05 only), for
#                      `sbatch --requeue=expedite`
#   B300_PREEMPT       1: partition priority preemption (PreemptType=preempt/partition_prio,
#                      PreemptMode=CANCEL) and a partition `urgent` (PriorityTier=10) over the
#                      same nodes, whose jobs end `batch` jobs in their way as PREEMPTED
#                      (default 0: neither)
#   B300_NETNS        1: every node in its own network namespace (see below; default 0:
#                      every slurmd at 127.0.0.1, a crashed node answers with a refused connect)
#   B300_NETNS_NET    with B300_NETNS=1, the third octet k of the nodes' network 10.213.k.0/24
#                      (default: derived from B300_CLUSTER_NAME, 20..219)
# Changing a knob changes the generated config; the next `up` restarts the daemons.
#
# Network-namespace mode (B300_NETNS=1, any release): node gpuNN lives in network
# namespace b300-CLUSTER-gpuNN at 10.213.k.(10+NN), linked by a veth pair into bridge
# b3brK in the root namespace, which holds the login node's address 10.213.k.1 (slurmctld,
# slurmdbd and the client tools stay in the root namespace). Neighbour entries are static,
# so a node that stops answering is silent (no ARP failure, no "no route to host").
#   power-off NODE   its link down, then its slurmd, slurmstepd and job processes killed -9:
#                    from everywhere else the node just goes silent (no FIN, no RST)
#   power-on NODE    its link up, slurmd restarted (bounded wait until slurmctld sees it)
#   netem NODE ARGS  tc netem ARGS on the node's link, both directions (e.g. `loss 5% delay
#                    200ms 200ms`); on a kernel without netem only `loss P%` (nftables);
#                    `netem NODE clear` removes it
#   partition NODE...  everything between those nodes and the login node dropped, both ways
#                    (nodes still reach each other); `heal` ends every partition
#   login-link down|up  the login node's own link to all nodes: all its traffic to and from
#                    the bridge dropped (silently: no error to a sender), the nodes still
#                    reach each other
# `down` also removes the namespaces, the veth pairs, the bridge and the nftables table.
set -euo pipefail
umask 022

readonly PROG=localcluster
CLUSTER_NAME=${B300_CLUSTER_NAME:-b300local}
PORT_BASE=${B300_PORT_BASE:-16800}
[[ $CLUSTER_NAME =~ ^[a-z][a-z0-9]{0,31}$ ]] || {
  printf '%s: ERROR: B300_CLUSTER_NAME must be [a-z][a-z0-9]{0,31} (got %s)\n' "$PROG" "$CLUSTER_NAME" >&2; exit 1; }
[[ $PORT_BASE =~ ^[0-9]{4,5}$ ]] && ((PORT_BASE >= 1024 && PORT_BASE <= 65000)) || {
  printf '%s: ERROR: B300_PORT_BASE must be 1024..65000 (got %s)\n' "$PROG" "$PORT_BASE" >&2; exit 1; }
readonly CLUSTER_NAME PORT_BASE
readonly CTLD_PORT=$((PORT_BASE + 17))
readonly DBD_PORT=$((PORT_BASE + 19))
readonly SLURMD_PORT_BASE=$((PORT_BASE + 101))      # gpu01 -> BASE+101, gpu02 -> BASE+102, ...
if [[ $CLUSTER_NAME == b300local ]]; then DB_NAME=b300_slurm_acct; else DB_NAME=b300_acct_$CLUSTER_NAME; fi

readonly SANE_PATH=/usr/sbin:/usr/bin:/sbin:/bin

DIR=${B300_CLUSTER_DIR:-/var/tmp/b300-cluster}
SLURM_REL=${B300_SLURM:-22.05}
SLURMD_TIMEOUT=${B300_SLURMD_TIMEOUT:-20}
PREEMPT=${B300_PREEMPT:-0}
EXPEDITE=${B300_EXPEDITED_REQUEUE:-0}
NODES=${B300_NODES:-4}
FAKE_GPUS=${B300_FAKE_GPUS:-1}
MIN_JOB_AGE=${B300_MIN_JOB_AGE:-300}
MAX_JOB_COUNT=${B300_MAX_JOB_COUNT:-30000}
NETNS=${B300_NETNS:-0}
NETNS_NET=${B300_NETNS_NET:-$((20 + $(printf '%s' "$CLUSTER_NAME" | cksum | cut -d' ' -f1) % 200))}
DB_HOST=${B300_DB_HOST:-127.0.0.1}
DB_PORT=${B300_DB_PORT:-3306}
DB_USER=${B300_DB_USER:-root}
DB_PASS=${B300_DB_PASS:-}

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ---------------------------------------------------------------- validation
[[ $DIR == /* && $DIR =~ ^[A-Za-z0-9._/-]+$ && $DIR != / ]] ||
  die "B300_CLUSTER_DIR must be an absolute path of [A-Za-z0-9._/-] (got '$DIR')"
DIR=${DIR%/}
[[ $NODES =~ ^[0-9]{1,2}$ ]] && (( 10#$NODES >= 1 )) || die "B300_NODES must be 1..99 (got '$NODES')"
NODES=$((10#$NODES))
[[ $FAKE_GPUS == 0 || $FAKE_GPUS == 1 ]] || die "B300_FAKE_GPUS must be 0 or 1"
[[ $MIN_JOB_AGE =~ ^[0-9]{1,7}$ ]] || die "B300_MIN_JOB_AGE must be a number of seconds"
[[ $SLURM_REL =~ ^(22\.05|24\.11|26\.05)$ ]] || die "B300_SLURM must be 22.05, 24.11 or 26.05 (got '$SLURM_REL')"
[[ $PREEMPT == [01] ]] || die "B300_PREEMPT must be 0 or 1 (got '$PREEMPT')"
[[ $EXPEDITE == [01] ]] || die "B300_EXPEDITED_REQUEUE must be 0 or 1 (got '$EXPEDITE')"
((EXPEDITE == 0)) || [[ $SLURM_REL == 26.05 ]] || die "B300_EXPEDITED_REQUEUE=1 needs B300_SLURM=26.05 (Slurm 25.11 or later)"
[[ $SLURMD_TIMEOUT =~ ^[0-9]{1,4}$ ]] && ((SLURMD_TIMEOUT >= 5)) || die "B300_SLURMD_TIMEOUT must be 5..9999 seconds"
[[ $NETNS == [01] ]] || die "B300_NETNS must be 0 or 1 (got '$NETNS')"
[[ $NETNS_NET =~ ^[0-9]{1,3}$ ]] && ((NETNS_NET >= 1 && NETNS_NET <= 254)) ||
  die "B300_NETNS_NET must be 1..254 (got '$NETNS_NET')"
[[ $DB_HOST =~ ^[A-Za-z0-9._:-]+$ ]] || die "bad B300_DB_HOST"
[[ $DB_PORT =~ ^[0-9]{1,5}$ ]] || die "bad B300_DB_PORT"
[[ $DB_USER =~ ^[A-Za-z0-9._-]+$ ]] || die "bad B300_DB_USER"
[[ $DB_PASS != *$'\n'* ]] || die "bad B300_DB_PASS"

readonly ETC=$DIR/etc LOGDIR=$DIR/log RUN=$DIR/run
readonly CONF=$ETC/slurm.conf DBD_CONF=$ETC/slurmdbd.conf GRES_CONF=$ETC/gres.conf
readonly CGROUP_CONF=$ETC/cgroup.conf RELEASE_FILE=$DIR/release REBOOT_PROGRAM=$ETC/reboot-node
readonly ROOTFS_DIR=$DIR/root BIN=$DIR/bin
readonly RELEASE_SH=$(dirname "$(readlink -f "$0")")/slurm-release.sh
readonly CLIENTS=(sinfo squeue scontrol sacct sacctmgr sbatch srun salloc scancel strigger sstat sprio sshare sdiag sreport)
if [[ $SLURM_REL == 22.05 ]]; then
  # The host's own Slurm: the layout every earlier version of this script used.
  ROOTFS="" STATE=$DIR/state SPOOL=$DIR/spool
else
  # Each release keeps its own state, spool and database: slurmctld refuses another
  # release's cluster id ("CLUSTER ID MISMATCH"), and slurmdbd converts tables one way.
  ROOTFS=$ROOTFS_DIR STATE=$DIR/state-$SLURM_REL SPOOL=$DIR/spool-$SLURM_REL
  DB_NAME=${DB_NAME}_${SLURM_REL/./}
fi
readonly ROOTFS STATE SPOOL DB_NAME
export SLURM_CONF=$CONF
if [[ -n $ROOTFS ]]; then export PATH=$BIN:$SANE_PATH:$PATH; else export PATH=$SANE_PATH:$PATH; fi

node_name() { printf 'gpu%02d' "$1"; }
ALL_NODES=()
for ((i = 1; i <= NODES; i++)); do ALL_NODES+=("$(node_name "$i")"); done
NODELIST="gpu[01-$(printf '%02d' "$NODES")]"
((NODES > 1)) || NODELIST=gpu01

node_port() { echo $((SLURMD_PORT_BASE + 10#${1#gpu} - 1)); }

validate_node() {
  local n=${1-}
  [[ $n =~ ^gpu[0-9]{2}$ ]] || die "bad node name '${n}' (expected gpuNN)"
  local x
  for x in "${ALL_NODES[@]}"; do [[ $x == "$n" ]] && return 0; done
  die "no node '$n' in this cluster (nodes: $NODELIST)"
}

need_root() { [[ $(id -u) -eq 0 ]] || die "must run as root"; }

# shellcheck source=deploy/localcluster-netns.sh
source "$(dirname "$(readlink -f "$0")")/localcluster-netns.sh"

# ---------------------------------------------------------------- processes
# All identification is exact: by the process name plus the config path in its
# command line (slurmctld, slurmd) or in its environment (slurmdbd has no -f;
# slurmstepd inherits the marker variables we start slurmd with).
comm_of() { local c=""; { read -r c <"/proc/$1/comm"; } 2>/dev/null || true; echo "$c"; }

args_have() { # pid, arg1, arg2: true if the command line holds arg1 immediately followed by arg2
  local pid=$1 a=$2 b=$3 args i
  mapfile -d '' -t args <"/proc/$pid/cmdline" 2>/dev/null || return 1
  for ((i = 0; i + 1 < ${#args[@]}; i++)); do
    [[ ${args[i]} == "$a" && ${args[i + 1]} == "$b" ]] && return 0
  done
  return 1
}

env_has() { grep -qzxF -- "$2" "/proc/$1/environ" 2>/dev/null; }

is_ours() { # pid kind [node]
  local pid=$1 kind=$2 node=${3-} comm
  [[ $pid =~ ^[0-9]+$ ]] && alive "$pid" || return 1
  comm=$(comm_of "$pid")
  case $kind in
    slurmctld) [[ $comm =~ ^slurmctld(-wlm)?$ ]] && args_have "$pid" -f "$CONF" ;;
    slurmd)
      [[ $comm =~ ^slurmd(-wlm)?$ ]] && args_have "$pid" -f "$CONF" &&
        { [[ -z $node ]] || args_have "$pid" -N "$node"; } ;;
    slurmdbd) [[ $comm == slurmdbd ]] && env_has "$pid" "SLURM_CONF=$CONF" ;;
    slurmstepd)
      [[ $comm =~ ^slurmstepd ]] && env_has "$pid" "B300_LC_CONF=$CONF" &&
        { [[ -z $node ]] || env_has "$pid" "B300_LC_NODE=$node"; } ;;
    *) return 1 ;;
  esac
}

find_pids() { # kind [node] -> our pids, one per line
  local kind=$1 node=${2-} pat pid
  case $kind in
    slurmctld) pat='^slurmctld(-wlm)?$' ;;
    slurmd) pat='^slurmd(-wlm)?$' ;;
    slurmdbd) pat='^slurmdbd$' ;;
    slurmstepd) pat='^slurmstepd' ;;
  esac
  local f c
  for f in /proc/[0-9]*/comm; do # a bash scan: much cheaper than forking pgrep
    { read -r c <"$f"; } 2>/dev/null || continue
    [[ $c =~ $pat ]] || continue
    pid=${f#/proc/}
    pid=${pid%/comm}
    is_ours "$pid" "$kind" "$node" && echo "$pid"
  done
  return 0
}

first_pid() { find_pids "$@" | head -n1; }

descendants() { # pids... -> the pids and all their descendants
  local -A kids=()
  local pid ppid p c
  while read -r pid ppid; do kids[$ppid]+=" $pid"; done < <(ps -e -o pid=,ppid=)
  local -a queue=("$@")
  local -A seen=()
  while ((${#queue[@]})); do
    p=${queue[0]}
    queue=("${queue[@]:1}")
    [[ -n ${seen[$p]-} ]] && continue
    seen[$p]=1
    echo "$p"
    for c in ${kids[$p]-}; do queue+=("$c"); done
  done
}

# Job processes of a node that escaped the process tree (setsid/daemonized).
job_procs_of_node() { # node
  local node=$1 pid
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    env_has "$pid" "SLURMD_NODENAME=$node" 2>/dev/null &&
      env_has "$pid" "SLURM_CLUSTER_NAME=$CLUSTER_NAME" && echo "$pid"
  done
  return 0
}

alive() { # pid: exists and is not a zombie (our PID 1 may reap late)
  local line st
  { read -r line <"/proc/$1/stat"; } 2>/dev/null || return 1
  st=${line##*) }
  st=${st%% *}
  [[ -n $st && $st != Z && $st != X ]]
}

stop_pids() { # signal-gracefully, wait, then SIGKILL; args: label pids...
  local label=$1
  shift
  (($#)) || return 0
  log "stopping $label (pid $*)"
  kill -TERM "$@" 2>/dev/null || true
  local deadline=$((SECONDS + 15)) p alive
  while ((SECONDS < deadline)); do
    alive=()
    for p in "$@"; do alive "$p" && alive+=("$p"); done
    ((${#alive[@]})) || return 0
    sleep 0.3
  done
  log "$label did not stop in 15 s, sending SIGKILL"
  kill -KILL "${alive[@]}" 2>/dev/null || true
}

kill_hard() { # stop then kill pids atomically-ish (no reparenting races); args: pids...
  (($#)) || return 0
  kill -STOP "$@" 2>/dev/null || true
  kill -KILL "$@" 2>/dev/null || true
  kill -CONT "$@" 2>/dev/null || true
}

# ---------------------------------------------------------------- ports
port_pids() { # port -> pids listening on it (TCP)
  ss -Hltnp "( sport = :$1 )" 2>/dev/null | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u
}

port_busy() { [[ -n $(ss -Hltn "( sport = :$1 )" 2>/dev/null) ]]; }

check_port_free() { # port label kind [node]
  local port=$1 label=$2 kind=$3 node=${4-} pid owners
  port_busy "$port" || return 0
  owners=$(port_pids "$port" | xargs)
  for pid in $owners; do
    is_ours "$pid" "$kind" "$node" && return 0
  done
  local who=""
  for pid in $owners; do who+=" [pid $pid: $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-120)]"; done
  die "port $port (for $label) is already in use by another process:${who:- (unknown)}. Free the port first."
}

# ---------------------------------------------------------------- config
gen_slurm_conf() {
  local n gres="" ctld_host=localhost
  ((FAKE_GPUS)) && gres=" Gres=gpu:8"
  # Network-namespace mode: the nodes reach slurmctld at the login node's bridge address.
  ((NETNS)) && ctld_host="localhost($LOGIN_ADDR)"
  cat <<EOF
# Generated by deploy/localcluster.sh; edits are overwritten on the next 'up'.
ClusterName=$CLUSTER_NAME
SlurmctldHost=$ctld_host
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT_BASE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$STATE
SlurmdSpoolDir=$SPOOL/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$ETC/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=$SLURMD_TIMEOUT
MessageTimeout=10
KillWait=5
UnkillableStepTimeout=30
InactiveLimit=0
Waittime=0
MinJobAge=$MIN_JOB_AGE
# The tracking benchmark queues 10,000 held jobs; the default cap is exactly 10,000.
MaxJobCount=$MAX_JOB_COUNT
MpiDefault=none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
RebootProgram=$REBOOT_PROGRAM
ResumeTimeout=60
EOF
  ((EXPEDITE)) && echo "SlurmctldParameters=enable_expedited_requeue"
  if ((PREEMPT)); then
    echo "PreemptType=preempt/partition_prio"
    echo "PreemptMode=CANCEL"
  fi
  if ((FAKE_GPUS)); then
    echo "AccountingStorageTRES=gres/gpu"
    echo "GresTypes=gpu"
  fi
  local addr=127.0.0.1
  for n in "${ALL_NODES[@]}"; do
    ((NETNS)) && addr=$(node_addr "$n")
    echo "NodeName=$n NodeHostname=localhost NodeAddr=$addr Port=$(node_port "$n") CPUs=2 RealMemory=2000${gres} State=UNKNOWN"
  done
  if ((PREEMPT)); then
    echo "PartitionName=batch Nodes=$NODELIST Default=YES MaxTime=INFINITE State=UP PriorityTier=1"
    echo "PartitionName=urgent Nodes=$NODELIST MaxTime=INFINITE State=UP PriorityTier=10"
  else
    echo "PartitionName=batch Nodes=$NODELIST Default=YES MaxTime=INFINITE State=UP"
  fi
}

# slurm.conf's RebootProgram (scontrol reboot). A local node cannot restart its machine:
# slurmd runs this program, which stops that slurmd and starts a new one for the same
# node in a new time namespace whose boot clock starts at 0: slurmctld sees a later
# BootTime and records the reboot as done (its nextstate, "reboot complete"). The new
# slurmd keeps the markers 'down' finds our daemons by (-f CONF -N NODE, B300_LC_*), and
# the old one's network namespace and root (it is started from the old one's child).
gen_reboot_program() {
  cat <<EOF
#!/bin/bash
# Generated by deploy/localcluster.sh: slurm.conf's RebootProgram (run by slurmd).
set -u
old=\$PPID # slurmd runs it with system(): through sh; walk up (bounded) to slurmd
for _ in 1 2 3 4; do
  [[ \$(cat "/proc/\$old/comm" 2>/dev/null) =~ ^slurmd ]] && break
  old=\$(awk '{print \$4}' "/proc/\$old/stat" 2>/dev/null || echo 1)
done
node=\$(tr '\0' '\n' <"/proc/\$old/cmdline" | sed -n '/^-N\$/{n;p;q}')
[[ \$node =~ ^gpu[0-9]{2}\$ ]] || { echo "reboot-node: no -N NODE in slurmd's command line" >&2; exit 1; }
echo "\$(date '+%F %T') reboot-node \$node: slurmd \$old restarted with a boot clock at 0" >>"$LOGDIR/reboot.log"
setsid bash -c '
  old=\$1 node=\$2
  sleep 1
  kill -TERM "\$old" 2>/dev/null
  for _ in \$(seq 1 100); do kill -0 "\$old" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "\$old" 2>/dev/null
  # The uptime of the host now (of this namespace, less its offset: a node rebooted
  # before runs in one), so the new BootTime is after the reboot request.
  off=0
  while read -r clock sec _; do [[ \$clock == boottime ]] && off=\$sec; done </proc/self/timens_offsets
  up=\$(( \$(cut -d. -f1 /proc/uptime) - off ))
  exec env -i PATH="$SANE_PATH" HOME=/root LANG=C.UTF-8 SLURM_CONF="$CONF" B300_LC_CONF="$CONF" \\
    B300_LC_NODE="\$node" unshare --time --boottime "-\$up" /usr/sbin/slurmd -f "$CONF" -N "\$node"
' reboot-node "\$old" "\$node" </dev/null >>"$LOGDIR/reboot.log" 2>&1 &
exit 0
EOF
}

# Slurm 22.05's gres/gpu drops GPUs that have no File= ("Removing file-less GPU"), so
# each fake GPU is a character device node with /dev/null's numbers (1:3) in $DIR/dev.
gen_gres_conf() {
  echo "# Generated by deploy/localcluster.sh: fake GPUs ($DIR/dev/gpuN are /dev/null clones)."
  echo "AutoDetect=off"
  echo "NodeName=$NODELIST Name=gpu File=$DIR/dev/gpu[0-7]"
}

make_fake_gpu_devices() {
  local i f
  mkdir -p "$DIR/dev"
  for i in 0 1 2 3 4 5 6 7; do
    f=$DIR/dev/gpu$i
    [[ -c $f ]] && continue
    rm -f "$f"
    # A regular file also works, slurmd then only logs "not a valid character device".
    mknod -m 666 "$f" c 1 3 2>/dev/null || : >"$f"
  done
}

gen_dbd_conf() {
  cat <<EOF
# Generated by deploy/localcluster.sh; edits are overwritten on the next 'up'.
AuthType=auth/munge
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
DebugLevel=info
LogFile=$LOGDIR/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=$DB_HOST
StoragePort=$DB_PORT
StorageUser=$DB_USER
StorageLoc=$DB_NAME
EOF
  [[ -z $DB_PASS ]] || echo "StoragePass=$DB_PASS"
}

write_if_changed() { # file mode content -> returns 0 if changed
  local file=$1 mode=$2 content=$3 tmp
  if [[ -f $file ]] && [[ $(<"$file") == "$content" ]]; then
    chmod "$mode" "$file"
    return 1
  fi
  tmp=$(mktemp "$file.XXXXXX")
  chmod "$mode" "$tmp"
  printf '%s\n' "$content" >"$tmp"
  mv -f "$tmp" "$file"
  return 0
}

# Writes the config files; sets SLURM_CHANGED/DBD_CHANGED.
write_configs() {
  mkdir -p "$ETC" "$LOGDIR" "$RUN" "$STATE" "$SPOOL"
  chmod 755 "$DIR" "$ETC" "$LOGDIR" "$RUN" "$SPOOL"
  chmod 700 "$STATE"
  local n
  for n in "${ALL_NODES[@]}"; do mkdir -p "$SPOOL/$n"; done
  [[ -f $ETC/plugstack.conf ]] || : >"$ETC/plugstack.conf"
  SLURM_CHANGED=0 DBD_CHANGED=0
  write_if_changed "$REBOOT_PROGRAM" 755 "$(gen_reboot_program)" || true
  write_if_changed "$CONF" 644 "$(gen_slurm_conf)" && SLURM_CHANGED=1
  if ((FAKE_GPUS)); then
    make_fake_gpu_devices
    write_if_changed "$GRES_CONF" 644 "$(gen_gres_conf)" && SLURM_CHANGED=1
  elif [[ -e $GRES_CONF ]]; then
    rm -f "$GRES_CONF"
    SLURM_CHANGED=1
  fi
  if [[ -n $ROOTFS ]]; then
    # 24.11+ slurmd stops with "No filesystem mounted on /sys/fs/cgroup" without it
    # (22.05 knows no such value).
    write_if_changed "$CGROUP_CONF" 644 "$(printf '%s\n' '# Generated by deploy/localcluster.sh.' 'CgroupPlugin=disabled')" && SLURM_CHANGED=1
  elif [[ -e $CGROUP_CONF ]]; then
    rm -f "$CGROUP_CONF"
    SLURM_CHANGED=1
  fi
  write_if_changed "$DBD_CONF" 600 "$(gen_dbd_conf)" && DBD_CHANGED=1
  return 0
}

# Client wrappers in $BIN: run this release's command in its root, in the caller's
# directory. Inside the root (a job calling srun) they run the command directly.
write_wrappers() {
  local c
  mkdir -p "$BIN"
  for c in "${CLIENTS[@]}"; do
    write_if_changed "$BIN/$c" 755 "#!/bin/sh
# Generated by deploy/localcluster.sh: Slurm $SLURM_REL's $c, run in $ROOTFS.
[ -e /usr/share/b300-slurm/release ] && exec /usr/bin/$c \"\$@\"
exec /usr/sbin/chroot $ROOTFS /bin/sh -c 'cd \"\$1\" 2>/dev/null || cd /; shift; exec \"\$@\"' $c \"\$PWD\" /usr/bin/$c \"\$@\"" || true
  done
}

# The release the daemons in $DIR run; switching stops them and unmounts the old root.
switch_release() {
  local was=""
  [[ -f $RELEASE_FILE ]] && was=$(<"$RELEASE_FILE")
  if [[ -n $was && $was != "$SLURM_REL" ]]; then
    log "switching $CLUSTER_NAME from Slurm $was to $SLURM_REL: stopping the $was daemons"
    stop_slurm_daemons
    stop_dbd
  fi
  if [[ -n $ROOTFS ]]; then
    bash "$RELEASE_SH" mount "$SLURM_REL" "$ROOTFS" || die "could not mount Slurm $SLURM_REL at $ROOTFS"
    write_wrappers
  else
    bash "$RELEASE_SH" umount "$ROOTFS_DIR"
    rm -rf "$BIN"
  fi
  printf '%s\n' "$SLURM_REL" >"$RELEASE_FILE"
}

# ---------------------------------------------------------------- helpers
tail_log() { # file
  local f=$1
  if [[ -f $f ]]; then
    log "last lines of $f:"
    tail -n 25 "$f" | sed 's/^/    /' >&2
  else
    log "(no log file $f)"
  fi
}

fail_with_log() { # message logfile...
  local msg=$1 f
  shift
  log "ERROR: $msg"
  for f in "$@"; do tail_log "$f"; done
  exit 1
}

run_daemon() { # start a Slurm daemon with a clean environment plus our markers
  # RUN_IN_NS: a command prefix run before the release's chroot (nsenter into a node's
  # network namespace: /run/netns is not inside the release root).
  # shellcheck disable=SC2086
  ${RUN_IN_NS:-} env -i PATH="$SANE_PATH" HOME=/root LANG=C.UTF-8 \
    SLURM_CONF="$CONF" B300_LC_CONF="$CONF" ${ROOTFS:+chroot "$ROOTFS"} "$@" \
    </dev/null >>"$LOGDIR/daemon-start.log" 2>&1 9>&-
}

ctld_up() { timeout 8 scontrol ping 2>/dev/null | grep -q 'is UP'; }
sacct_ok() { timeout 15 sacct -n -X -P -S now-1hours -o jobid >/dev/null 2>&1 </dev/null; }

node_states() { # -> "node state" lines (sinfo long states, '*' = not responding)
  timeout 10 sinfo -h -N -p batch -o '%N %T' 2>/dev/null | sort -u
}

healthy_state() { [[ $1 =~ ^(idle|allocated|mixed|completing|planned|reserved)$ ]]; }

all_nodes_healthy() {
  local out n s count=0
  out=$(node_states) || return 1
  while read -r n s; do
    [[ -n $n ]] || continue
    healthy_state "$s" || return 1
    count=$((count + 1))
  done <<<"$out"
  ((count == NODES))
}

munge_ok() { timeout 5 munge -n 2>/dev/null | timeout 5 unmunge >/dev/null 2>&1; }

# ---------------------------------------------------------------- munge
ensure_munge() {
  if munge_ok; then return 0; fi
  if [[ ! -s /etc/munge/munge.key ]]; then
    log "creating /etc/munge/munge.key"
    mkdir -p /etc/munge
    timeout 30 mungekey -c -k /etc/munge/munge.key
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge
  chmod 0755 /run/munge
  local p running=""
  for p in $(pgrep -x munged || true); do alive "$p" && running=1; done
  if [[ -z $running ]]; then
    log "starting munged"
    timeout 15 runuser -u munge -- /usr/sbin/munged --force </dev/null >/dev/null 2>&1 9>&- ||
      fail_with_log "munged failed to start" /var/log/munge/munged.log
  fi
  local deadline=$((SECONDS + 10))
  until munge_ok; do
    ((SECONDS < deadline)) || fail_with_log "munge does not work (munge -n | unmunge)" /var/log/munge/munged.log
    sleep 0.3
  done
}

# ---------------------------------------------------------------- slurmdbd
ensure_dbd() {
  if [[ -z $(first_pid slurmdbd) ]]; then
    check_port_free "$DBD_PORT" slurmdbd slurmdbd
    log "starting slurmdbd (port $DBD_PORT, MariaDB $DB_HOST:$DB_PORT db $DB_NAME)"
    # Newer releases: the host's libmariadb.so.3 (see deploy/slurm-release.sh).
    run_daemon ${ROOTFS:+env LD_LIBRARY_PATH=/usr/lib/b300-dbdlib} /usr/sbin/slurmdbd || fail_with_log "slurmdbd failed to start" "$LOGDIR/slurmdbd.log" "$LOGDIR/daemon-start.log"
  fi
  local deadline=$((SECONDS + 60)) clusters
  until clusters=$(timeout 10 sacctmgr -n -P show cluster format=cluster </dev/null 2>/dev/null); do
    [[ -n $(first_pid slurmdbd) ]] || fail_with_log "slurmdbd exited" "$LOGDIR/slurmdbd.log"
    ((SECONDS < deadline)) || fail_with_log "slurmdbd does not answer after 60 s" "$LOGDIR/slurmdbd.log"
    sleep 0.5
  done
  if ! grep -qx "$CLUSTER_NAME" <<<"$clusters"; then
    log "registering cluster $CLUSTER_NAME in slurmdbd"
    timeout 20 sacctmgr -i add cluster "$CLUSTER_NAME" </dev/null >/dev/null ||
      fail_with_log "sacctmgr add cluster failed" "$LOGDIR/slurmdbd.log"
  fi
}

# ---------------------------------------------------------------- slurmctld
ensure_ctld() {
  if [[ -z $(first_pid slurmctld) ]]; then
    check_port_free "$CTLD_PORT" slurmctld slurmctld
    log "starting slurmctld (port $CTLD_PORT)"
    run_daemon /usr/sbin/slurmctld -f "$CONF" ||
      fail_with_log "slurmctld failed to start" "$LOGDIR/slurmctld.log" "$LOGDIR/daemon-start.log"
  fi
  local deadline=$((SECONDS + 30))
  until ctld_up; do
    [[ -n $(first_pid slurmctld) ]] || fail_with_log "slurmctld exited" "$LOGDIR/slurmctld.log"
    ((SECONDS < deadline)) || fail_with_log "slurmctld does not answer after 30 s" "$LOGDIR/slurmctld.log"
    sleep 0.3
  done
}

# ---------------------------------------------------------------- slurmd
start_slurmd() { # node (validated)
  local node=$1
  [[ -z $(first_pid slurmd "$node") ]] || return 0
  local netns=""
  if ((NETNS)); then # its own namespace: no other process can hold its port
    netns="nsenter --net=/run/netns/$(node_ns "$node")"
  else
    check_port_free "$(node_port "$node")" "slurmd $node" slurmd "$node"
  fi
  mkdir -p "$SPOOL/$node"
  log "starting slurmd $node (port $(node_port "$node")${netns:+, at $(node_addr "$node") in $(node_ns "$node")})"
  RUN_IN_NS=$netns run_daemon env B300_LC_NODE="$node" /usr/sbin/slurmd -f "$CONF" -N "$node" ||
    fail_with_log "slurmd $node failed to start" "$LOGDIR/slurmd-$node.log" "$LOGDIR/daemon-start.log"
}

wait_slurmd_alive() { # node: bounded wait until the process exists and listens
  local node=$1 deadline=$((SECONDS + 15))
  until [[ -n $(first_pid slurmd "$node") ]] && node_port_busy "$node"; do
    ((SECONDS < deadline)) || fail_with_log "slurmd $node did not come up" "$LOGDIR/slurmd-$node.log"
    sleep 0.2
  done
}

# Wait until every node responds; resume nodes left DOWN/DRAIN by earlier tests.
settle_nodes() {
  local deadline=$((SECONDS + 60)) out n s resumed
  local -A done_resume=()
  while :; do
    out=$(node_states || true)
    if all_nodes_healthy; then return 0; fi
    while read -r n s; do
      [[ -n $n && $n =~ ^gpu[0-9]{2}$ ]] || continue
      healthy_state "$s" && continue
      [[ $s == *'*' ]] && continue # not responding yet: wait for registration
      if [[ $s =~ (down|drain|fail|inval) && -z ${done_resume[$n]-} ]]; then
        log "resuming node $n (was $s)"
        timeout 10 scontrol update nodename="$n" state=resume >/dev/null 2>&1 || true
        done_resume[$n]=1
      fi
    done <<<"$out"
    if ((SECONDS >= deadline)); then
      log "ERROR: nodes not all healthy after 60 s:"
      printf '%s\n' "$out" | sed 's/^/    /' >&2
      timeout 10 scontrol show node -o 2>/dev/null | grep -o 'NodeName=[^ ]*\|Reason=.*' | sed 's/^/    /' >&2 || true
      tail_log "$LOGDIR/slurmctld.log"
      exit 1
    fi
    sleep 1
  done
}

# ---------------------------------------------------------------- stop
stop_slurm_daemons() { # [keep-jobs]; without it also kills our nodes' slurmstepd and job processes
  local keep_jobs=${1-} pids
  pids=$(find_pids slurmctld | xargs)
  # shellcheck disable=SC2086
  [[ -z $pids ]] || stop_pids slurmctld $pids
  pids=$(find_pids slurmd | xargs)
  # shellcheck disable=SC2086
  [[ -z $pids ]] || stop_pids slurmd $pids
  pids=$(find_pids slurmstepd | xargs)
  if [[ -n $pids && -z $keep_jobs ]]; then
    # shellcheck disable=SC2086
    pids=$(descendants $pids | xargs)
    log "killing leftover slurmstepd and job processes (pid $pids)"
    # shellcheck disable=SC2086
    kill_hard $pids
  fi
  rm -f "$RUN/slurmctld.pid" "$RUN"/slurmd-*.pid
}

stop_dbd() {
  local pids
  pids=$(find_pids slurmdbd | xargs)
  # shellcheck disable=SC2086
  [[ -z $pids ]] || stop_pids slurmdbd $pids
  rm -f "$RUN/slurmdbd.pid"
}

# ---------------------------------------------------------------- commands
with_lock() {
  mkdir -p "$DIR"
  exec 9>"$DIR/.lock"
  flock -w 180 9 || die "another localcluster.sh is running on $DIR (lock $DIR/.lock)"
}

cmd_up() {
  need_root
  with_lock
  local t0=$SECONDS
  mkdir -p "$LOGDIR"
  switch_release
  write_configs
  if ((SLURM_CHANGED)) && [[ -n $(find_pids slurmctld)$(find_pids slurmd) ]]; then
    log "slurm.conf/gres.conf changed: restarting slurmctld and slurmd (running jobs are kept)"
    stop_slurm_daemons keep-jobs
  fi
  if ((DBD_CHANGED)) && [[ -n $(find_pids slurmdbd) ]]; then
    log "slurmdbd.conf changed: restarting slurmdbd"
    stop_dbd
  fi
  # Fail before starting anything if a port we need is held by a foreign process.
  [[ -n $(first_pid slurmdbd) ]] || check_port_free "$DBD_PORT" slurmdbd slurmdbd
  [[ -n $(first_pid slurmctld) ]] || check_port_free "$CTLD_PORT" slurmctld slurmctld
  local n
  if ((NETNS)); then
    netns_setup
  else
    for n in "${ALL_NODES[@]}"; do
      [[ -n $(first_pid slurmd "$n") ]] || check_port_free "$(node_port "$n")" "slurmd $n" slurmd "$n"
    done
  fi
  ensure_munge
  ensure_dbd
  ensure_ctld
  for n in "${ALL_NODES[@]}"; do start_slurmd "$n"; done
  for n in "${ALL_NODES[@]}"; do wait_slurmd_alive "$n"; done
  settle_nodes
  local deadline=$((SECONDS + 30))
  until sacct_ok; do
    ((SECONDS < deadline)) || fail_with_log "sacct does not work" "$LOGDIR/slurmdbd.log" "$LOGDIR/slurmctld.log"
    sleep 1
  done
  log "Slurm: $(timeout 10 sinfo -V 2>&1) ($( [[ -n $ROOTFS ]] && echo "in $ROOTFS" || echo host))"
  log "cluster $CLUSTER_NAME up: $NODES nodes $NODELIST$( ((FAKE_GPUS)) && echo ', gpu:8 each (fake)'), ready in $((SECONDS - t0)) s"
  cmd_env
}

cmd_down() {
  need_root
  with_lock
  stop_slurm_daemons
  stop_dbd
  netns_teardown
  bash "$RELEASE_SH" umount "$ROOTFS_DIR"
  rm -f "$RELEASE_FILE"
  log "cluster $CLUSTER_NAME down (munged left running)"
}

cmd_status() {
  local rc=0 p n
  if munge_ok; then log "munged: ok (pid $(pgrep -x munged | xargs))"; else log "munged: NOT working"; rc=1; fi
  p=$(find_pids slurmdbd | xargs)
  if [[ -n $p ]]; then log "slurmdbd: pid $p"; else log "slurmdbd: not running"; rc=1; fi
  p=$(find_pids slurmctld | xargs)
  if [[ -n $p ]]; then log "slurmctld: pid $p"; else log "slurmctld: not running"; rc=1; fi
  for n in "${ALL_NODES[@]}"; do
    p=$(find_pids slurmd "$n" | xargs)
    if [[ -n $p ]]; then log "slurmd $n: pid $p"; else log "slurmd $n: not running"; rc=1; fi
  done
  if [[ -f $CONF ]] && ctld_up; then
    timeout 10 sinfo -N -o '%N %9P %T %G %E' 2>&1 || rc=1
    all_nodes_healthy || rc=1
    sacct_ok || { log "sacct: NOT working"; rc=1; }
  else
    log "slurmctld does not answer"
    rc=1
  fi
  cmd_env
  return "$rc"
}

cmd_env() {
  echo "export SLURM_CONF=$CONF"
  [[ -z $ROOTFS ]] || printf 'export B300_SLURM=%s PATH=%s:"$PATH"\n' "$SLURM_REL" "$BIN"
}

cmd_kill_node() { # node (validated)
  local node=$1 slurmd_pids stepd_pids all
  need_root
  slurmd_pids=$(find_pids slurmd "$node" | xargs)
  stepd_pids=$(find_pids slurmstepd "$node" | xargs)
  # shellcheck disable=SC2086
  all=$( { descendants $slurmd_pids $stepd_pids; job_procs_of_node "$node"; } | sort -un | xargs)
  if [[ -z $all ]]; then
    log "node $node: nothing running (slurmd already dead)"
    return 0
  fi
  # shellcheck disable=SC2086
  kill_hard $all
  log "node $node crashed: killed -9 slurmd (${slurmd_pids:-none}), slurmstepd (${stepd_pids:-none}) and job processes (pids $all)"
  log "slurmctld marks it DOWN after SlurmdTimeout=$SLURMD_TIMEOUT s (+ up to ~20 s ping interval); bring it back with: $0 restart-node $node"
}

cmd_freeze_node() { # node (validated)
  # A node powered off: slurmd gone, the job's processes stopped where they are, so no
  # socket closes and the job's other ranks wait in their collective (NCCL/gloo timeout)
  # while Slurm still shows the job RUNNING. kill-node then restart-node bring it back.
  local node=$1 slurmd_pids stepd_pids frozen
  need_root
  slurmd_pids=$(find_pids slurmd "$node" | xargs)
  stepd_pids=$(find_pids slurmstepd "$node" | xargs)
  # shellcheck disable=SC2086
  frozen=$( { descendants $stepd_pids; job_procs_of_node "$node"; } | sort -un | xargs)
  # shellcheck disable=SC2086
  [[ -z $frozen ]] || kill -STOP $frozen 2>/dev/null || true
  # shellcheck disable=SC2086
  [[ -z $slurmd_pids ]] || kill_hard $slurmd_pids
  log "node $node frozen: killed -9 slurmd (${slurmd_pids:-none}), stopped slurmstepd and job processes (pids ${frozen:-none})"
}

node_back() { # node resume(0|1) seconds: slurmd (re)started, bounded wait until slurmctld has
  # the node in service; resume=1 also lifts a DOWN/DRAIN it answers under. Its last state: BACK_STATE.
  local node=$1 resume=$2 deadline last=-10
  need_root
  [[ -f $CONF ]] || die "no config at $CONF: run '$0 up' first"
  with_lock
  ctld_up || die "slurmctld is not running: run '$0 up'"
  if ((resume)); then
    [[ -n $(first_pid slurmd "$node") ]] || start_slurmd "$node"
  else
    start_slurmd "$node"
  fi
  wait_slurmd_alive "$node"
  # ReturnToService=2 returns a node that was DOWN for not responding to service on registration.
  BACK_STATE=""
  deadline=$((SECONDS + $3))
  while ((SECONDS < deadline)); do
    BACK_STATE=$(timeout 10 sinfo -h -N -n "$node" -o '%T' 2>/dev/null | head -n1 || true)
    healthy_state "$BACK_STATE" && { log "node $node is back ($BACK_STATE)"; return 0; }
    # Responding (no '*') but held DOWN or DRAIN: lift it (again every 5 s while so).
    if ((resume)) && [[ $BACK_STATE =~ ^(down|drained|draining|drain|fail|failing)$ ]] &&
      ((SECONDS - last >= 5)); then
      timeout 10 scontrol update "NodeName=$node" State=RESUME >/dev/null 2>&1 || true
      last=$SECONDS
    fi
    sleep 0.5
  done
  return 1
}

cmd_restart_node() { # node (validated)
  node_back "$1" 0 30 ||
    log "slurmd $1 runs, but slurmctld reports the node as '$BACK_STATE' (use 'up' to resume DOWN/DRAIN nodes)"
  return 0
}

cmd_revive() { # node (validated): slurmd running again, a DOWN/DRAIN lifted, back in service
  node_back "$1" 1 45 || die "node $1 not back in 45 s (slurmctld reports '$BACK_STATE')"
}

usage() {
  echo "usage: $0 {up|down|status|env|restart-node NODE|revive NODE|kill-node NODE|freeze-node NODE|power-off NODE|power-on NODE|netem NODE ARGS...|partition NODE...|heal|login-link down|up}" >&2
  exit 2
}

main() {
  local cmd=${1-}
  case $cmd in
    up) (($# == 1)) || usage; cmd_up ;;
    down) (($# == 1)) || usage; cmd_down ;;
    status) (($# == 1)) || usage; cmd_status ;;
    env) (($# == 1)) || usage; cmd_env ;;
    kill-node) (($# == 2)) || usage; validate_node "$2"; cmd_kill_node "$2" ;;
    freeze-node) (($# == 2)) || usage; validate_node "$2"; cmd_freeze_node "$2" ;;
    restart-node) (($# == 2)) || usage; validate_node "$2"; cmd_restart_node "$2" ;;
    revive) (($# == 2)) || usage; validate_node "$2"; cmd_revive "$2" ;;
    power-off) (($# == 2)) || usage; validate_node "$2"; cmd_power_off "$2" ;;
    power-on) (($# == 2)) || usage; validate_node "$2"; cmd_power_on "$2" ;;
    netem) (($# >= 3)) || usage; validate_node "$2"; cmd_netem "${@:2}" ;;
    partition)
      (($# >= 2)) || usage
      local n
      for n in "${@:2}"; do validate_node "$n"; done
      cmd_partition "${@:2}" ;;
    heal) (($# == 1)) || usage; cmd_heal ;;
    login-link) (($# == 2)) || usage; cmd_login_link "$2" ;;
    *) usage ;;
  esac
}

main "$@"
