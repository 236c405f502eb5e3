#!/usr/bin/env bash
# Newer Slurm releases beside the host's 22.05, for `make test-matrix` and MALLETRAIN_SLURM:
#   24.11  Debian trixie's packages in a chroot (debootstrap --variant=minbase);
#   25.11  built from ../shared/vendor/slurm inside that chroot into /opt/slurm-25.11
#          (--enable-multiple-slurmd, json-c for --json, lua for job_submit.lua);
#   26.05  the same from the vendored 26.05 tarball into /opt/slurm-26.05.
# Everything lives under build/slurm-matrix/ (git-ignored); each step leaves a stamp, so a second
# run only checks the mounts. Run as root. Prints the seconds each step took.
#
#   scripts/setup-slurm-matrix.sh [all|chroot|24.11|25.11|26.05|pyslurm|mount|umount]   (default: all)
#
# How the releases run (devtools/localcluster/releases.py): slurmctld and slurmd run
# chrooted (their slurmstepd and plugins are the chroot's); the chroot sees the checkout's parent,
# /tmp, /home and the host's Python (with torch) at the same paths, so job scripts and the
# epilog run unchanged. Client commands run on the host through the chroot's dynamic loader
# (build/slurm-matrix/bin-<release>/), so any user can call them and the daemon needs no chroot.
# Env: MIRROR (default: the host's Debian mirror), SLURM_TARBALL / SLURM26_TARBALL (default: the
# vendored ones).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
base=$repo/build/slurm-matrix
ROOT=$base/trixie
MIRROR=${MIRROR:-$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || echo http://deb.debian.org/debian)}
SLURM_TARBALL=${SLURM_TARBALL:-$(ls "$repo"/../shared/vendor/slurm/slurm-25.11.*.tar.gz 2>/dev/null | tail -1)}
SLURM26_TARBALL=${SLURM26_TARBALL:-$(ls "$repo"/../shared/vendor/slurm/slurm-26.05.*.tar.gz 2>/dev/null | tail -1)}
PREFIX25=/opt/slurm-25.11
CH=(chroot "$ROOT" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive)
mkdir -p "$base"
timed() {  # timed NAME CMD...: run, print and log the seconds
  local s=$SECONDS name=$1
  shift
  "$@"
  echo "setup-slurm-matrix: $name took $((SECONDS - s)) s" | tee -a "$base/times.log"
}

[ "$(id -u)" = 0 ] || { echo "setup-slurm-matrix: run as root (debootstrap, chroot, mounts)" >&2; exit 2; }

# Paths the chroot shares with the host, at the same place: the checkout and its neighbours,
# temp dirs (pytest roots, munge sockets), homes (test users) and the host's Python with torch.
python_home() { dirname "$(dirname "$(readlink -f "$(command -v "${PYTHON:-python3}")")")"; }
shared_dirs() {
  local d
  for d in "$(dirname "$repo")" /tmp /home "$(python_home)"; do
    case $d in /|/usr|/usr/*|/bin|/lib*|/etc|/var) continue ;; esac  # the chroot's own
    echo "$d"
  done | sort -u
}

do_mount() {
  local d
  mkdir -p "$ROOT/proc" "$ROOT/sys" "$ROOT/dev"
  mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
  mountpoint -q "$ROOT/sys" || mount -t sysfs sys "$ROOT/sys"
  mountpoint -q "$ROOT/dev" || mount --bind /dev "$ROOT/dev"
  for d in /dev/pts /dev/shm; do
    mountpoint -q "$d" || continue
    mountpoint -q "$ROOT$d" || mount --bind "$d" "$ROOT$d"
  done
  while read -r d; do
    [ -d "$d" ] || continue
    mkdir -p "$ROOT$d"
    mountpoint -q "$ROOT$d" || mount --bind "$d" "$ROOT$d"
  done < <(shared_dirs)
  # users and hosts as on the host (test users are created on the host)
  cp -p /etc/passwd /etc/group /etc/shadow /etc/gshadow /etc/hosts "$ROOT/etc/"
}

do_umount() {
  local m
  # deepest first; only mounts under our root
  for m in $(awk -v r="$ROOT/" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r); do
    umount "$m" || umount -l "$m"
  done
}

make_chroot() {
  [ -f "$ROOT/.mt-debootstrap" ] && return 0
  command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
  nice -n 10 debootstrap --variant=minbase trixie "$ROOT" "$MIRROR" >"$base/debootstrap.log" 2>&1 \
    || { tail -20 "$base/debootstrap.log" >&2; exit 1; }
  touch "$ROOT/.mt-debootstrap"
}

# Slurm 24.11 and munge; what the host's Python needs to load its modules and torch (libssl,
# libffi, ...); python3 for the epilog's #!/usr/bin/python3; the 25.11 build's tools.
PKGS=(slurmctld slurmd slurm-client slurm-wlm-basic-plugins munge libslurm-dev lua-socket
      python3-minimal libexpat1 libffi8 zlib1g libbz2-1.0 liblzma5 libsqlite3-0 libreadline8t64
      libncursesw6 libssl3t64 libuuid1 libstdc++6 libgomp1 procps
      gcc make pkgconf libmunge-dev libjson-c-dev liblua5.4-dev)
packages() {
  [ -f "$ROOT/.mt-packages" ] && return 0
  do_mount
  printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"  # no service starts in the chroot
  chmod +x "$ROOT/usr/sbin/policy-rc.d"
  "${CH[@]}" nice -n 10 bash -c "dpkg --configure -a && apt-get update -qq && apt-get install -y -qq --no-install-recommends ${PKGS[*]}" \
    >"$base/apt.log" 2>&1 || { tail -20 "$base/apt.log" >&2; exit 1; }
  touch "$ROOT/.mt-packages"
}

build_slurm() {  # build_slurm RELEASE TARBALL: the release into /opt/slurm-RELEASE of the chroot
  local rel=$1 tarball=$2 prefix=/opt/slurm-$1
  [ -x "$ROOT$prefix/sbin/slurmctld" ] && [ -f "$ROOT$prefix/.mt-built" ] && return 0
  [ -f "$tarball" ] || { echo "setup-slurm-matrix: no Slurm $rel tarball (../shared/vendor/slurm/slurm-$rel.*.tar.gz); set SLURM_TARBALL or SLURM26_TARBALL" >&2; exit 2; }
  do_mount
  rm -rf "$ROOT/opt/src/slurm-$rel"
  mkdir -p "$ROOT/opt/src/slurm-$rel"
  tar -xzf "$tarball" --strip-components=1 -C "$ROOT/opt/src/slurm-$rel"
  "${CH[@]}" bash -c "cd /opt/src/slurm-$rel && nice -n 10 ./configure -q --prefix=$prefix \
      --sysconfdir=$prefix/etc --enable-multiple-slurmd --without-hdf5 \
      >/opt/src/configure-$rel.log 2>&1 \
    && grep -q 'define HAVE_LUA 1' config.h && grep -q 'define HAVE_JSON 1' config.h \
    && nice -n 10 make -s -j2 >/opt/src/make-$rel.log 2>&1 && make -s install >/opt/src/install-$rel.log 2>&1" \
    || { tail -30 "$ROOT/opt/src/configure-$rel.log" "$ROOT/opt/src/make-$rel.log" 2>/dev/null >&2; exit 1; }
  touch "$ROOT$prefix/.mt-built"
}

# pyslurm, whose MAJOR.MINOR must equal Slurm's: 24.11.0 (not on PyPI) from ../shared/vendor/pyslurm
# for 24.11, PyPI's 25.11.2 for 25.11. Each in its own venv of the chroot's Python (the module
# links the chroot's libslurm, built for glibc 2.41: it loads only in a chroot process).
PYSLURM_TARBALL=${PYSLURM_TARBALL:-$(ls "$repo"/../shared/vendor/pyslurm/pyslurm-24.11.*.tar.gz 2>/dev/null | tail -1)}
build_pyslurm() {  # build_pyslurm RELEASE
  local rel=$1 venv=/opt/pyslurm-$1 src lib inc
  [ -f "$ROOT$venv/.mt-built" ] && return 0
  do_mount
  if [ ! -f "$ROOT/.mt-python-dev" ]; then
    "${CH[@]}" nice -n 10 apt-get install -y -qq --no-install-recommends python3-dev python3-venv \
      >>"$base/apt.log" 2>&1 || { tail -20 "$base/apt.log" >&2; exit 1; }
    touch "$ROOT/.mt-python-dev"
  fi
  # the host's CA bundle (a TLS-intercepting proxy may sit between us and PyPI), own name
  cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/host-ca-bundle.crt"
  rm -rf "$ROOT$venv"
  "${CH[@]}" python3 -m venv "$venv"
  if [ "$rel" = 24.11 ]; then
    [ -f "$PYSLURM_TARBALL" ] || { echo "setup-slurm-matrix: no pyslurm 24.11 tarball (../shared/vendor/pyslurm); set PYSLURM_TARBALL" >&2; exit 2; }
    rm -rf "$ROOT/opt/src/pyslurm-24.11"; mkdir -p "$ROOT/opt/src/pyslurm-24.11"
    tar -xzf "$PYSLURM_TARBALL" --strip-components=1 -C "$ROOT/opt/src/pyslurm-24.11"
    src=/opt/src/pyslurm-24.11 lib=/usr/lib/x86_64-linux-gnu/slurm-wlm inc=/usr/include
  else
    src=pyslurm==25.11.2 lib=$PREFIX25/lib inc=$PREFIX25/include
  fi
  "${CH[@]}" env SSL_CERT_FILE=/etc/ssl/certs/host-ca-bundle.crt PIP_CERT=/etc/ssl/certs/host-ca-bundle.crt \
      SLURM_LIB_DIR=$lib SLURM_INCLUDE_DIR=$inc PYSLURM_BUILD_JOBS=2 \
      nice -n 10 "$venv/bin/pip" install -q --no-cache-dir "$src" >"$base/pyslurm-$rel.log" 2>&1 \
    || { tail -30 "$base/pyslurm-$rel.log" >&2; exit 1; }
  # (importing pyslurm needs a running cluster's slurm.conf: the tests do that)
  "${CH[@]}" "$venv/bin/pip" show pyslurm | grep '^Version'
  touch "$ROOT$venv/.mt-built"
}

case "${1:-all}" in
  chroot) timed debootstrap make_chroot; timed packages packages ;;
  24.11) timed debootstrap make_chroot; timed packages packages; do_mount ;;
  25.11) timed debootstrap make_chroot; timed packages packages; timed build-25.11 build_slurm 25.11 "$SLURM_TARBALL" ;;
  26.05) timed debootstrap make_chroot; timed packages packages; timed build-26.05 build_slurm 26.05 "$SLURM26_TARBALL" ;;
  all) timed debootstrap make_chroot; timed packages packages
    timed build-25.11 build_slurm 25.11 "$SLURM_TARBALL"
    timed build-26.05 build_slurm 26.05 "$SLURM26_TARBALL"; do_mount ;;
  pyslurm) timed pyslurm-24.11 build_pyslurm 24.11; timed pyslurm-25.11 build_pyslurm 25.11
    # the pyslurm tests trace the daemon's execs (no Slurm command may be started)
    command -v strace >/dev/null || { apt-get update -qq && apt-get install -y -qq strace >/dev/null; } ;;
  mount) do_mount ;;
  umount) do_umount ;;
  *) echo "usage: $0 [all|chroot|24.11|25.11|26.05|pyslurm|mount|umount]" >&2; exit 2 ;;
esac
