#!/usr/bin/env bash
# Install b300d as a systemd service on a Slurm login node (Debian 12/13, as root):
#   bash deploy/install.sh [--admin-group GROUP] [--prefix /opt/b300]
# Creates the user/group b300 and the admin group, a venv under the prefix with this
# checkout installed, /etc/b300/b300.toml (from deploy/examples/b300.toml, mode 640
# root:b300; kept if present), /var/lib/b300, and the unit. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

ADMIN_GROUP=b300-admins
PREFIX=/opt/b300
while [[ $# -gt 0 ]]; do
  case $1 in
    --admin-group) ADMIN_GROUP=$2; shift 2 ;;
    --prefix) PREFIX=$2; shift 2 ;;
    *) echo "usage: $0 [--admin-group GROUP] [--prefix DIR]" >&2; exit 2 ;;
  esac
done
log() { printf 'install: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[[ $(id -u) -eq 0 ]] || die "must run as root"
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "$PY is older than 3.11"

getent group b300 >/dev/null || groupadd --system b300
getent passwd b300 >/dev/null || useradd --system --gid b300 --home-dir /var/lib/b300 \
  --no-create-home --shell /usr/sbin/nologin --comment "b300 orchestrator" b300
getent group "$ADMIN_GROUP" >/dev/null || groupadd --system "$ADMIN_GROUP"
log "user b300, admin group $ADMIN_GROUP"

install -d -m 0755 "$PREFIX"
[[ -x $PREFIX/venv/bin/python ]] || "$PY" -m venv "$PREFIX/venv"
"$PREFIX/venv/bin/python" -m pip install --quiet --disable-pip-version-check ".[report,s3,postgres]"
install -m 0644 README.md "$PREFIX/README.md"
ln -sf "$PREFIX/venv/bin/b300ctl" /usr/local/bin/b300ctl
log "venv $PREFIX/venv"

install -d -m 0755 /etc/b300
if [[ ! -e /etc/b300/b300.toml ]]; then
  sed -e "s/^admin_group = .*/admin_group = \"$ADMIN_GROUP\"/" \
      -e 's|^# socket = "/run/b300/b300d.sock".*|socket = "/run/b300/b300d.sock"|' \
      deploy/examples/b300.toml > /etc/b300/b300.toml
  log "wrote /etc/b300/b300.toml (edit it: slurm, job_log_dir, report, alerts)"
else
  log "kept the existing /etc/b300/b300.toml"
fi
chown root:b300 /etc/b300/b300.toml
chmod 0640 /etc/b300/b300.toml
install -d -m 0750 -o b300 -g b300 /var/lib/b300
install -m 0644 deploy/b300d.service /etc/systemd/system/b300d.service
sed -i "s|/opt/b300/|$PREFIX/|g" /etc/systemd/system/b300d.service

# Containers usually have no systemd as PID 1: install the unit, but do not talk to it.
if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null; then
  systemctl daemon-reload
  log "installed; start it with: systemctl enable --now b300d"
else
  log "systemd is not running here (container?): unit installed, not loaded;"
  log "run b300d by hand: sudo -u b300 $PREFIX/venv/bin/b300d --config /etc/b300/b300.toml"
fi
