#!/usr/bin/env bash
# Install what MalleTrain needs on a fresh Debian 12 machine, as root; idempotent.
#   Debian: Slurm 22.05 (slurmctld, slurmd, client, basic plugins with job_submit/lua), munge,
#           lua-socket (the job_submit.lua datagram), lua5.1 (tests of job_submit.lua's logic),
#           faketime (libfaketime: the fault test of a node whose clock jumps),
#           gdb (a test counts which threads of a training process take the GIL),
#           rpm (rpmbuild: the test of the RPM, `make rpm`).
#           With MALLETRAIN_ACCOUNTING=1 also MariaDB + slurmdbd (the local cluster's
#           accounting mode, `slurm_conf/local/start.sh --accounting`).
#           With MALLETRAIN_PBS=1 also OpenPBS's build and run dependencies (PostgreSQL for its
#           datastore), then scripts/build-openpbs.sh builds OpenPBS from ../shared/vendor/openpbs
#           into build/openpbs (cached: a second run skips it), for the real-PBS tests.
#   PyPI:   this package in editable mode with the training (CPU torch 2.13.0) and dev extras.
# MALLETRAIN_SKIP_APT=1 skips the Debian part (no root, or already provisioned);
# MALLETRAIN_SKIP_PIP=1 skips the PyPI part.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

apt_pkgs=(slurmctld slurmd slurm-client munge slurm-wlm-basic-plugins lua-socket lua5.1 faketime
          gdb rpm)
if [ "${MALLETRAIN_ACCOUNTING:-0}" = 1 ]; then
  apt_pkgs+=(mariadb-server slurmdbd slurm-wlm-mysql-plugin)
fi
if [ "${MALLETRAIN_PBS:-0}" = 1 ]; then
  apt_pkgs+=(gcc g++ make autoconf automake libtool pkg-config perl swig python3 python3-dev
             libhwloc-dev libx11-dev libxt-dev libxext-dev libxft-dev libedit-dev libedit2
             libical-dev libical3 libncurses-dev libexpat1-dev expat libssl-dev libcjson-dev
             tcl tcl-dev tk tk-dev postgresql postgresql-contrib postgresql-server-dev-all
             iproute2)
fi
if [ "${MALLETRAIN_SKIP_APT:-0}" != 1 ]; then
  missing=()
  for p in "${apt_pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

stamp=.setup-stamp
# The stamp alone is not enough: the editable install may point at another checkout (a clone
# set up since) or torch may be gone; find_spec reads no module, so this costs milliseconds.
here_installed() {
  "$PY" - "$PWD" <<'PYEOF' 2>/dev/null
import importlib.util, os, sys
sys.path = [p for p in sys.path if p and os.path.realpath(p) != os.path.realpath(sys.argv[1])]
spec = importlib.util.find_spec("malletrain_core")
ok = (spec is not None and spec.origin is not None and importlib.util.find_spec("torch")
      and os.path.realpath(spec.origin).startswith(os.path.realpath(sys.argv[1]) + os.sep))
sys.exit(0 if ok else 1)
PYEOF
}
if [ "${MALLETRAIN_SKIP_PIP:-0}" != 1 ] && { [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ] \
     || ! here_installed; }; then
  echo "setup: pip install -e .[train,dev,lightning,hf] (torch pinned to the 2.13.0 CPU wheel)"
  "$PY" -m pip install -q --disable-pip-version-check "torch==2.13.0"
  "$PY" -m pip install -q --disable-pip-version-check -e ".[train,dev,lightning,hf]"
  touch "$stamp"
fi

if [ "${MALLETRAIN_PBS:-0}" = 1 ]; then
  # Exit 2: the source is not beside the checkout; the pbs_real tests then skip, saying so.
  rc=0; bash scripts/build-openpbs.sh || rc=$?
  [ "$rc" = 0 ] || [ "$rc" = 2 ] || exit "$rc"
fi
