#!/usr/bin/env bash
# Install b300d as a systemd service on a Slurm login node (Debian 12/13, as root):
#
#   bash deploy/install.sh [--admin-group GROUP] [--slurm-account ACCOUNT] [dirs]
#   bash deploy/install.sh --uninstall [--purge] [--resume-drained] [dirs]
#
# Install: the system user/group b300 and the admin group (default: the config's
# admin_group when the config exists, else b300-admins); a venv of the system
# python under PREFIX with this checkout installed as a wheel (not editable);
# CONFIG_DIR/b300.toml from deploy/examples/b300.toml (kept if present), mode 640
# root:<admin group>: the admins read it (b300ctl) and so does b300, a member of
# that group; it holds no secret. Then, while the config still has the example's
# job_log_dir or [checkpoints] roots, it stops (exit 1) before creating any folder:
# edit them and run it again. The folders the config says the daemon writes
# (state_dir, socket, job_log_dir, [checkpoints] roots; created for b300 when
# missing; state_dir b300:<admin group> mode 2750, so that the admins read the
# SQLite store and never write it); [daemon] database_password_file, if set, is made
# root:<admin group> mode 640 (the admins may read the store). Secrets only b300
# reads ([report] password_file, target key files) are the site's: root:b300 640.
# The unit and a drop-in b300d.service.d/paths.conf whose ReadWritePaths are those
# folders (run install.sh again after changing them in the config); b300ctl in BIN_DIR.
# --slurm-account ACCOUNT also adds the Slurm user b300 to ACCOUNT with admin level
# Admin (sacctmgr): draining and resuming nodes needs it (docs/install.md, "Slurm rights of the b300 user").
# Idempotent.
#
# Uninstall: stops the service, removes the node-down strigger whose program is in
# the daemon's state_dir (a PERM trigger outlives the daemon), the daemon's spare
# pool reservations (b300-spares-*: they never end by themselves), the unit, drop-in,
# venv and b300ctl link. It lists the nodes the daemon drained (drained by user b300
# with a reason starting "b300:" or "drift:") with the command that returns each;
# --resume-drained returns them. A node drained by anyone else, or for another
# reason, is never touched. Config, state and the user stay unless --purge, which also
# removes CONFIG_DIR, state_dir, the socket folder, the user/group b300 and its
# Slurm user (sacctmgr). The admin group and folders outside state_dir (a shared
# job_log_dir, checkpoint roots) are never removed.
#
# dirs (defaults): --prefix /opt/b300  --config-dir /etc/b300
#                  --unit-dir /etc/systemd/system  --bin-dir /usr/local/bin
set -euo pipefail
cd "$(dirname "$0")/.."

ADMIN_GROUP=
PREFIX=/opt/b300
CONFIG_DIR=/etc/b300
UNIT_DIR=/etc/systemd/system
BIN_DIR=/usr/local/bin
SLURM_ACCOUNT=
MODE=install
PURGE=0
RESUME_DRAINED=0
usage() {
  echo "usage: $0 [--admin-group GROUP] [--slurm-account ACCOUNT] [--prefix DIR] [--config-dir DIR]" >&2
  echo "       [--unit-dir DIR] [--bin-dir DIR] | --uninstall [--purge] [--resume-drained] [same dirs]" >&2
  exit 2
}
while [[ $# -gt 0 ]]; do
  case $1 in
    --admin-group) [[ $# -ge 2 ]] || usage; ADMIN_GROUP=$2; shift 2 ;;
    --slurm-account) [[ $# -ge 2 ]] || usage; SLURM_ACCOUNT=$2; shift 2 ;;
    --prefix) [[ $# -ge 2 ]] || usage; PREFIX=$2; shift 2 ;;
    --config-dir) [[ $# -ge 2 ]] || usage; CONFIG_DIR=$2; shift 2 ;;
    --unit-dir) [[ $# -ge 2 ]] || usage; UNIT_DIR=$2; shift 2 ;;
    --bin-dir) [[ $# -ge 2 ]] || usage; BIN_DIR=$2; shift 2 ;;
    --uninstall) MODE=uninstall; shift ;;
    --purge) PURGE=1; shift ;;
    --resume-drained) RESUME_DRAINED=1; shift ;;
    *) usage ;;
  esac
done
log() { printf 'install: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[[ $(id -u) -eq 0 ]] || die "must run as root"
for d in "$PREFIX" "$CONFIG_DIR" "$UNIT_DIR" "$BIN_DIR"; do
  [[ $d == /* && $d =~ ^[A-Za-z0-9._/-]+$ && $d != / ]] || die "not an absolute path of [A-Za-z0-9._/-]: '$d'"
done
[[ -z $ADMIN_GROUP || $ADMIN_GROUP =~ ^[A-Za-z_][A-Za-z0-9_.-]{0,31}$ ]] || die "bad group name '$ADMIN_GROUP'"
[[ -z $SLURM_ACCOUNT || $SLURM_ACCOUNT =~ ^[A-Za-z0-9_.-]{1,64}$ ]] || die "bad Slurm account '$SLURM_ACCOUNT'"
((PURGE == 0)) || [[ $MODE == uninstall ]] || die "--purge goes with --uninstall"
((RESUME_DRAINED == 0)) || [[ $MODE == uninstall ]] || die "--resume-drained goes with --uninstall"

CONF=$CONFIG_DIR/b300.toml
VENV=$PREFIX/venv
UNIT=$UNIT_DIR/b300d.service
DROPIN_DIR=$UNIT_DIR/b300d.service.d
have_systemd() { [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null; }
as_b300() { setpriv --reuid=b300 --regid=b300 --init-groups -- "$@"; }

# The folders the daemon writes, from the config itself (b300d --print-paths).
daemon_paths() { "$VENV/bin/b300d" --config "$CONF" --print-paths; }

# One key of a TOML file (TABLE KEY), as lines (a list gives one line per item; missing: none).
toml_get() {
  "${PYTHON:-/usr/bin/python3}" - "$1" "$2" "$3" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    value = tomllib.load(f).get(sys.argv[2], {}).get(sys.argv[3], "")
for item in value if isinstance(value, list) else [value]:
    if item != "":
        print(item)
PY
}

# A path from the config goes into a unit file: refuse what systemd would split or expand.
unit_safe() { [[ $1 == /* && $1 =~ ^[A-Za-z0-9._/@+:=,-]+$ ]]; }

write_dropin() {
  local paths=() p home=0
  while IFS= read -r p; do
    [[ -n $p ]] || continue
    unit_safe "$p" || die "cannot put '$p' into the unit (spaces or special characters): choose another folder"
    paths+=("$p")
    [[ $p == /home || $p == /home/* || $p == /root || $p == /root/* || $p == /run/user/* ]] && home=1
  done < <(daemon_paths)
  install -d -m 0755 "$DROPIN_DIR"
  {
    echo "# Written by deploy/install.sh from $CONF (b300d --print-paths): the folders"
    echo "# the daemon writes. Run install.sh again after changing state_dir, socket,"
    echo "# job_log_dir or [checkpoints] roots."
    echo "[Service]"
    echo "ReadWritePaths=${paths[*]}"
    if ((home)); then
      # ProtectHome=yes hides /home entirely; tmpfs + BindPaths shows only these folders.
      echo "ProtectHome=tmpfs"
      for p in "${paths[@]}"; do
        [[ $p == /home/* || $p == /root/* || $p == /run/user/* ]] && echo "BindPaths=$p"
      done
    fi
  } > "$DROPIN_DIR/paths.conf.tmp"
  mv "$DROPIN_DIR/paths.conf.tmp" "$DROPIN_DIR/paths.conf"
  chmod 0644 "$DROPIN_DIR/paths.conf"
  log "drop-in $DROPIN_DIR/paths.conf: ReadWritePaths=${paths[*]}"
}

# Refuse to create the example's folders: a config not edited yet would scatter them.
refuse_example_paths() {
  local example=deploy/examples/b300.toml p keys=() found=()
  local log_dir roots
  log_dir=$(toml_get "$example" daemon job_log_dir)
  roots=$(toml_get "$example" checkpoints roots)
  while IFS= read -r p; do
    if [[ -n $p && $p == "$log_dir" ]]; then keys+=("[daemon] job_log_dir"); found+=("$p"); fi
    if [[ -n $p ]] && grep -qxF -- "$p" <<<"$roots"; then keys+=("[checkpoints] roots"); found+=("$p"); fi
  done < <(daemon_paths)
  ((${#keys[@]} == 0)) && return 0
  die "$CONF still has the example's paths (${found[*]}): edit ${keys[*]}, then run install.sh again; no folder created"
}

make_paths() {
  local p state=""
  while IFS= read -r p; do
    [[ -n $p ]] || continue
    if [[ -z $state ]]; then
      # The first is state_dir: the admin group reads the store (setgid: its files too).
      state=$p
      if [[ ! -e $p ]]; then
        install -d -m 2750 -o b300 -g "$ADMIN_GROUP" "$p"
        log "created $p for b300, readable by $ADMIN_GROUP"
      elif [[ $(stat -c %U "$p") == b300 ]]; then
        chgrp -R "$ADMIN_GROUP" "$p"
        chmod g+rs,g-w,o-rwx "$p"
        # The SQLite store of an older install (UMask 0007) becomes read-only for the group.
        find "$p" -mindepth 1 -maxdepth 1 -type f -name 'state.db*' -exec chmod g+r,g-w,o-rwx {} +
      else
        log "WARNING: $p is not owned by b300 (the daemon will refuse it)"
      fi
      continue
    fi
    if [[ ! -e $p ]]; then
      install -d -m 0750 -o b300 -g b300 "$p"
      log "created $p for b300"
    elif ! as_b300 test -w "$p"; then
      log "WARNING: user b300 cannot write $p (the daemon will refuse it)"
    fi
  done < <(daemon_paths)
}

# [daemon] database_password_file: read by b300 (a member) and the admins, nobody else.
secure_password_file() {
  local f
  f=$(toml_get "$CONF" daemon database_password_file)
  [[ -n $f ]] || return 0
  if [[ -f $f ]]; then
    chown root:"$ADMIN_GROUP" "$f"
    chmod 0640 "$f"
    log "$f: root:$ADMIN_GROUP 640"
  else
    log "WARNING: [daemon] database_password_file $f does not exist (b300d will refuse to start)"
  fi
}

slurm_user() {
  command -v sacctmgr >/dev/null || die "--slurm-account needs sacctmgr"
  if [[ -n $(sacctmgr -n -P show user b300 format=user </dev/null) ]]; then
    sacctmgr -i modify user where name=b300 set adminlevel=Admin </dev/null >/dev/null
  else
    sacctmgr -i add user b300 account="$SLURM_ACCOUNT" adminlevel=Admin </dev/null >/dev/null
  fi
  local level
  level=$(sacctmgr -n -P show user b300 format=adminlevel </dev/null)
  [[ $level == Administrator ]] || die "sacctmgr: b300 has admin level '$level', not Administrator"
  log "Slurm user b300 in account $SLURM_ACCOUNT, admin level Administrator"
}

install_all() {
  local py=${PYTHON:-/usr/bin/python3}
  "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "$py is older than 3.11"
  getent group b300 >/dev/null || groupadd --system b300
  getent passwd b300 >/dev/null || useradd --system --gid b300 --home-dir /var/lib/b300 \
    --no-create-home --shell /usr/sbin/nologin --comment "b300 orchestrator" b300
  # A re-run keeps the installed config's admin group; a different --admin-group would
  # leave the config and the groups disagreeing.
  local configured=""
  [[ -e $CONF ]] && configured=$(toml_get "$CONF" daemon admin_group)
  if [[ -n $configured && -n $ADMIN_GROUP && $configured != "$ADMIN_GROUP" ]]; then
    die "$CONF has admin_group = \"$configured\", not $ADMIN_GROUP: edit it, or leave out --admin-group"
  fi
  ADMIN_GROUP=${ADMIN_GROUP:-${configured:-b300-admins}}
  [[ $ADMIN_GROUP =~ ^[A-Za-z_][A-Za-z0-9_.-]{0,31}$ ]] || die "bad admin_group '$ADMIN_GROUP' in $CONF"
  getent group "$ADMIN_GROUP" >/dev/null || groupadd --system "$ADMIN_GROUP"
  # The daemon gives its control socket to the admin group: only a member may chgrp.
  id -nG b300 | tr ' ' '\n' | grep -qxF "$ADMIN_GROUP" || usermod -a -G "$ADMIN_GROUP" b300
  log "user b300, admin group $ADMIN_GROUP"

  install -d -m 0755 "$PREFIX"
  [[ -x $VENV/bin/python ]] || "$py" -m venv "$VENV"
  # A wheel built from this checkout, not an editable install: what runs is what shipped.
  local wheels whl
  wheels=$(mktemp -d)
  "$VENV/bin/python" -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$wheels" . >&2
  whl=$(echo "$wheels"/b300_orchestrator-*.whl)
  [[ -f $whl ]] || die "pip wheel built no b300_orchestrator wheel"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$whl" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$whl[report,s3,postgres]" >&2
  rm -rf "$wheels"
  install -m 0644 README.md "$PREFIX/README.md"
  install -d -m 0755 "$BIN_DIR"
  ln -sfn "$VENV/bin/b300ctl" "$BIN_DIR/b300ctl"
  log "venv $VENV (b300 $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("b300-orchestrator"))'))"

  install -d -m 0755 "$CONFIG_DIR"
  if [[ ! -e $CONF ]]; then
    sed -e "s/^admin_group = .*/admin_group = \"$ADMIN_GROUP\"/" \
        -e 's|^# socket = "/run/b300/b300d.sock".*|socket = "/run/b300/b300d.sock"|' \
        deploy/examples/b300.toml > "$CONF"
    log "wrote $CONF (edit it: slurm, job_log_dir, [checkpoints] roots, report, alerts)"
  else
    log "kept the existing $CONF"
  fi
  chown root:"$ADMIN_GROUP" "$CONF"
  chmod 0640 "$CONF"
  refuse_example_paths
  make_paths
  secure_password_file
  install -d -m 0755 "$UNIT_DIR"
  sed -e "s|/opt/b300/|$PREFIX/|g" -e "s|/etc/b300/b300.toml|$CONF|g" deploy/b300d.service > "$UNIT.tmp"
  mv "$UNIT.tmp" "$UNIT"
  chmod 0644 "$UNIT"
  write_dropin
  [[ -z $SLURM_ACCOUNT ]] || slurm_user

  # Containers usually have no systemd as PID 1: install the unit, but do not talk to it.
  if have_systemd; then
    systemctl daemon-reload
    log "installed; start it with: systemctl enable --now b300d"
  else
    log "systemd is not running here (container?): unit installed, not loaded;"
    log "run b300d by hand: setpriv --reuid=b300 --regid=b300 --init-groups $VENV/bin/b300d --config $CONF"
  fi
}

# The daemon's drain reasons start with these (b300.recovery: "b300: ...", b300.drift:
# "drift: ..."); with user b300 as the drainer, the drain is surely the daemon's.
DRAIN_PREFIXES=("b300:" "drift:")

# Delete the spare pools' reservations (they have no end) and list (or return) the
# nodes the daemon drained. Needs Slurm's tools; skipped with a warning without them.
release_slurm() {
  local conf="" line name node user reason p ours
  if [[ -r $CONF ]]; then conf=$(toml_get "$CONF" slurm conf || true); fi
  if [[ -n $conf ]]; then export SLURM_CONF=$conf; fi
  if ! command -v scontrol >/dev/null || ! command -v sinfo >/dev/null; then
    log "WARNING: no scontrol/sinfo here: check 'scontrol show reservation' for b300-spares-* and 'sinfo -R' for drains by b300"
    return 0
  fi
  while IFS= read -r line; do
    name=${line#ReservationName=}
    name=${name%% *}
    [[ $name == b300-spares-* && $name =~ ^[A-Za-z0-9_.-]+$ ]] || continue
    if scontrol delete "reservation=$name" </dev/null >/dev/null; then
      log "deleted the spare pool reservation $name"
    else
      log "WARNING: could not delete reservation $name: scontrol delete reservation=$name"
    fi
  done < <(scontrol -o show reservation </dev/null 2>/dev/null | grep '^ReservationName=' || true)
  local drained=()
  while IFS='|' read -r node user reason; do
    [[ -n $node && $user == b300 && $node =~ ^[A-Za-z0-9_.-]+$ ]] || continue
    ours=0
    for p in "${DRAIN_PREFIXES[@]}"; do
      if [[ $reason == "$p"* ]]; then ours=1; fi
    done
    if ((ours)); then drained+=("$node"); fi
  done < <(sinfo -h -N -R -o '%N|%u|%E' </dev/null 2>/dev/null | sort -u)
  ((${#drained[@]})) || { log "no node drained by the daemon"; return 0; }
  for node in "${drained[@]}"; do
    if ((RESUME_DRAINED)); then
      if scontrol update "NodeName=$node" State=RESUME </dev/null >/dev/null; then
        log "returned $node (drained by the daemon)"
      else
        log "WARNING: could not return $node: scontrol update NodeName=$node State=RESUME"
      fi
    else
      log "drained by the daemon: $node; return it with: scontrol update NodeName=$node State=RESUME"
    fi
  done
  ((RESUME_DRAINED)) || log "--resume-drained returns them all"
}

uninstall_all() {
  local paths=() p
  if have_systemd && [[ -e $UNIT ]]; then
    systemctl disable --now b300d || log "WARNING: could not stop b300d"
  fi
  if [[ -x $VENV/bin/b300d && -r $CONF ]]; then
    mapfile -t paths < <(daemon_paths || true)
    # The PERM strigger stays in slurmctld after the daemon is gone: remove ours.
    "$VENV/bin/b300d" --config "$CONF" --remove-trigger || log "WARNING: node-down trigger not removed"
  else
    log "no venv or config: cannot look up the trigger; check 'strigger --get' for node-down-trigger"
  fi
  release_slurm
  rm -f "$UNIT" "$DROPIN_DIR/paths.conf"
  rmdir "$DROPIN_DIR" 2>/dev/null || true
  if [[ -L $BIN_DIR/b300ctl && $(readlink "$BIN_DIR/b300ctl") == "$VENV/"* ]]; then
    rm -f "$BIN_DIR/b300ctl"
  fi
  rm -rf "$VENV" "$PREFIX/README.md"
  rmdir "$PREFIX" 2>/dev/null || log "kept $PREFIX (not empty)"
  have_systemd && systemctl daemon-reload
  log "removed the service, venv and b300ctl"
  ((PURGE)) || { log "kept $CONF, the state and user b300 (--purge removes them)"; return 0; }

  rm -rf "$CONFIG_DIR"
  # The daemon's own folders (made for b300 by install) go; a folder b300 does not own
  # (a shared job_log_dir, a checkpoint root with users' data) is never touched.
  local state=${paths[0]:-}
  if [[ -n $state && -d $state && $(stat -c %U "$state") == b300 ]]; then
    rm -rf -- "$state"
  fi
  for p in "${paths[@]:1}"; do
    [[ $p == "$state"/* || ! -e $p ]] && continue
    if [[ $p == /run/b300 ]]; then
      rm -rf /run/b300
    elif [[ $(stat -c %U "$p") == b300 ]] && rmdir "$p" 2>/dev/null; then
      log "removed the empty $p"
    else
      log "kept $p (outside the state directory)"
    fi
  done
  if command -v sacctmgr >/dev/null && [[ -n $(sacctmgr -n -P show user b300 format=user </dev/null 2>/dev/null) ]]; then
    sacctmgr -i delete user b300 </dev/null >/dev/null || log "WARNING: sacctmgr could not delete user b300"
  fi
  getent passwd b300 >/dev/null && userdel b300
  getent group b300 >/dev/null && groupdel b300
  log "purged $CONFIG_DIR, the state, user and group b300 (the admin group stays)"
}

if [[ $MODE == install ]]; then install_all; else uninstall_all; fi
