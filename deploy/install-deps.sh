#!/usr/bin/env bash
# Install the Debian packages deploy/localcluster.sh needs (Debian 12/13, run as root).
# Idempotent and fast when everything is already installed (one dpkg-query, no apt).
# MariaDB/PostgreSQL servers are expected to be running already; only the MariaDB
# client CLI is installed here if missing.
set -euo pipefail

log() { printf 'install-deps: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root"

PKGS=(
  slurmctld slurmd slurm-client slurmdbd
  munge openssh-server openssh-client clustershell rsync
  mmdebstrap # newer Slurm releases in chroots (deploy/slurm-release.sh)
  procps iproute2 coreutils util-linux
  nftables   # deploy/localcluster.sh B300_NETNS=1: partition, login-link, loss without netem
  python3-venv   # deploy/install.sh: a venv of the system python (tests/install)
  systemd    # systemd-analyze verify for deploy/b300d.service (not run as PID 1 here)
  chromium   # renders the weekly report's HTML to a PNG in the tests
  # promtool for `promtool check rules deploy/prometheus/b300-rules.yml` (tests/ops/test_dashboards.py):
  # verified in bookworm's prometheus 2.42.0+ds-5+deb12u1 (`dpkg -c`: ./usr/bin/promtool).
  # The package also installs a prometheus.service; only promtool is used here.
  prometheus
)

# The MariaDB client CLI: keep whatever provides it, otherwise install mariadb-client.
if ! command -v mariadb >/dev/null 2>&1 && ! command -v mysql >/dev/null 2>&1; then
  PKGS+=(mariadb-client)
fi

missing() {
  local p status
  for p in "${PKGS[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
    [[ $status == ii* ]] || printf '%s\n' "$p"
  done
}

mapfile -t MISSING < <(missing)
if [[ ${#MISSING[@]} -eq 0 ]]; then
  log "all packages already installed"
  exit 0
fi

# Another apt/dpkg run (e.g. a provisioning script) may hold the lock: wait, bounded.
wait_apt() {
  local deadline=$((SECONDS + 900))
  while pgrep -x 'apt|apt-get|dpkg|unattended-upgr' >/dev/null 2>&1; do
    (( SECONDS < deadline )) || die "another apt/dpkg process is still running after 900 s"
    log "waiting for another apt/dpkg process to finish..."
    sleep 5
  done
}

wait_apt
# Re-check: the other run may have installed them.
mapfile -t MISSING < <(missing)
if [[ ${#MISSING[@]} -eq 0 ]]; then
  log "all packages already installed"
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
log "installing: ${MISSING[*]}"
timeout 600 apt-get update -qq || die "apt-get update failed"
# No service a package brings is started by its install (prometheus would start a server
# on :9090; only its promtool is used): Debian's policy-rc.d convention, for this install
# only, and only when the machine has no policy of its own.
POLICY=/usr/sbin/policy-rc.d
OWN_POLICY=0
if [[ ! -e $POLICY ]]; then
  printf '#!/bin/sh\nexit 101\n' >"$POLICY" && chmod 755 "$POLICY" && OWN_POLICY=1
fi
rc=0
timeout 1200 apt-get install -y -q --no-install-recommends \
  -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
  -o DPkg::Lock::Timeout=300 \
  "${MISSING[@]}" || rc=$?
((OWN_POLICY == 0)) || rm -f "$POLICY"
((rc == 0)) || die "apt-get install failed"

mapfile -t MISSING < <(missing)
[[ ${#MISSING[@]} -eq 0 ]] || die "still missing after install: ${MISSING[*]}"
log "done"
