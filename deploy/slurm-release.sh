#!/usr/bin/env bash
# The Slurm releases the local cluster can run, besides the host's own.
#
#   slurm-release.sh build REL         build (or reuse) REL's cached Slurm tree; prints it
#   slurm-release.sh mount REL DIR     DIR becomes this machine's / with REL's /usr over it
#   slurm-release.sh umount DIR        undo `mount` (everything under DIR)
#   slurm-release.sh list              the releases and where each comes from
#
# REL is 22.05 (the host's Debian 12 packages: nothing to build or mount), 24.11 (Debian
# 13 "trixie") or 26.05 (Debian unstable). A newer release is a Debian chroot made by
# mmdebstrap from Debian's own packages, cached in ${B300_SLURM_CACHE:-/var/cache/b300-slurm}/REL
# (about 180 MB, 1-3 min to build once). It is not used as a whole system: `mount`
# stacks the chroot's /usr over the host's /usr (read-only overlayfs) on a bind of the
# host's /, so paths, /work, /tmp, the host's munged socket and the Python that jobs run
# are the same as on the host while every Slurm binary, plugin and library is REL's.
# Only what mount made is unmounted (umount -R DIR); nothing outside DIR is touched.
set -euo pipefail
umask 022

readonly PROG=slurm-release
readonly CACHE=${B300_SLURM_CACHE:-/var/cache/b300-slurm}
readonly MIRROR=${B300_DEBIAN_MIRROR:-http://deb.debian.org/debian}
readonly PACKAGES=slurmctld,slurmd,slurm-client,slurmdbd
readonly MARK=usr/share/b300-slurm/release   # exists only in a release tree

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

suite_of() { # release -> Debian suite ("" for the host's release)
  case $1 in
    22.05) echo "" ;;
    24.11) echo trixie ;;
    26.05) echo sid ;;
    *) die "unknown Slurm release '$1' (known: 22.05 24.11 26.05)" ;;
  esac
}

need_root() { [[ $(id -u) -eq 0 ]] || die "must run as root"; }

check_dir() {
  [[ $1 == /* && $1 =~ ^[A-Za-z0-9._/-]+$ && $1 != / ]] || die "bad directory '$1'"
}

cmd_build() {
  local rel=$1 suite tree tmp t0=$SECONDS got
  suite=$(suite_of "$rel")
  [[ -n $suite ]] || { log "$rel is the host's Slurm: nothing to build"; return 0; }
  tree=$CACHE/$rel/root
  if [[ -f $tree/$MARK ]]; then
    echo "$tree"
    return 0
  fi
  need_root
  command -v mmdebstrap >/dev/null || die "mmdebstrap is not installed (deploy/install-deps.sh installs it)"
  mkdir -p "$CACHE/$rel"
  exec 8>"$CACHE/$rel/.lock"
  flock -w 900 8 || die "another build of $rel holds $CACHE/$rel/.lock"
  if [[ -f $tree/$MARK ]]; then echo "$tree"; return 0; fi
  tmp=$CACHE/$rel/root.new
  rm -rf "$tmp" "$tree"
  log "building Slurm $rel from Debian $suite into $tree (mmdebstrap, once)"
  # The reachable archive is a frozen snapshot: its Release files are past Valid-Until.
  timeout 1200 mmdebstrap --mode=root --variant=apt --include="$PACKAGES" \
    --aptopt='Acquire::Check-Valid-Until "false"' "$suite" "$tmp" "$MIRROR" \
    >"$CACHE/$rel/build.log" 2>&1 || {
    tail -n 20 "$CACHE/$rel/build.log" >&2
    rm -rf "$tmp"
    die "mmdebstrap $suite failed (log: $CACHE/$rel/build.log)"
  }
  got=$(chroot "$tmp" dpkg-query -W -f='${Version}' slurmctld)
  [[ $got == "$rel".* ]] || { rm -rf "$tmp"; die "Debian $suite carries Slurm $got, not $rel"; }
  # slurmdbd with trixie/sid's MariaDB client library (11.8) dies with "5027 Number of
  # columns in result ... exceeds maximum"; the host's (Debian 12) libmariadb.so.3 works.
  mkdir -p "$tmp/usr/lib/b300-dbdlib"
  cp /usr/lib/x86_64-linux-gnu/libmariadb.so.3 "$tmp/usr/lib/b300-dbdlib/" ||
    die "no /usr/lib/x86_64-linux-gnu/libmariadb.so.3 on the host (package libmariadb3)"
  mkdir -p "$tmp/usr/share/b300-slurm"
  printf '%s %s\n' "$rel" "$got" >"$tmp/$MARK"
  mv "$tmp" "$tree"
  log "Slurm $got ready in $((SECONDS - t0)) s"
  echo "$tree"
}

is_mounted() { findmnt -rn -M "$1" >/dev/null 2>&1; }

cmd_mount() {
  local rel=$1 dir=$2 tree
  need_root
  check_dir "$dir"
  [[ -n $(suite_of "$rel") ]] || die "$rel is the host's Slurm: nothing to mount"
  tree=$(cmd_build "$rel")
  if is_mounted "$dir/usr" && [[ $(cat "$dir/$MARK" 2>/dev/null) == "$(cat "$tree/$MARK")" ]]; then
    return 0
  fi
  is_mounted "$dir" && cmd_umount "$dir"
  mkdir -p "$dir"
  # A plain (non-recursive) bind of /: no other cluster's mounts come along, and
  # private, so nothing mounted later on the host shows up in it either.
  mount --bind / "$dir"
  mount --make-private "$dir"
  local d
  for d in proc sys dev; do
    mount --rbind "/$d" "$dir/$d"
    mount --make-rslave "$dir/$d"
  done
  mount -t overlay -o "ro,lowerdir=$tree/usr:/usr" b300-slurm "$dir/usr"
  # The host's 22.05 plugins share the directory's name: hide them behind REL's own.
  mount --bind "$tree/usr/lib/x86_64-linux-gnu/slurm-wlm" "$dir/usr/lib/x86_64-linux-gnu/slurm-wlm"
  log "mounted Slurm $(cut -d' ' -f2 "$tree/$MARK") at $dir"
}

cmd_umount() {
  local dir=$1
  need_root
  check_dir "$dir"
  is_mounted "$dir" || return 0
  # Processes of the release (a job's last children) may take a moment to exit after
  # their daemons were stopped: retry for up to 10 s, then detach lazily.
  local i
  for ((i = 0; i < 20; i++)); do
    umount -R "$dir" 2>/dev/null && { log "unmounted $dir"; return 0; }
    sleep 0.5
  done
  log "$dir still busy after 10 s (pids: $(fuser -m "$dir/usr" 2>/dev/null | xargs)): detaching it lazily"
  umount -R -l "$dir"
  log "unmounted $dir"
}

cmd_list() {
  local rel suite tree
  for rel in 22.05 24.11 26.05; do
    suite=$(suite_of "$rel")
    tree=$CACHE/$rel/root
    if [[ -z $suite ]]; then echo "$rel host (Debian 12 packages)"
    elif [[ -f $tree/$MARK ]]; then echo "$rel Debian $suite, built: $(cut -d' ' -f2 "$tree/$MARK")"
    else echo "$rel Debian $suite, not built yet"
    fi
  done
}

usage() { echo "usage: $0 {build REL | mount REL DIR | umount DIR | list}" >&2; exit 2; }

case ${1-} in
  build) (($# == 2)) || usage; cmd_build "$2" ;;
  mount) (($# == 3)) || usage; cmd_mount "$2" "$3" ;;
  umount) (($# == 2)) || usage; cmd_umount "$2" ;;
  list) (($# == 1)) || usage; cmd_list ;;
  *) usage ;;
esac
