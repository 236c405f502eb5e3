#!/usr/bin/env bash
# Build OpenPBS for the real-PBS test tier from the vendored source, once.
#   Source:  ../shared/vendor/openpbs/openpbs-23.06.06.tar.gz plus its two patches (Python 3.11).
#   Result:  build/openpbs/install (the PBS_EXEC of the local complex, see
#            devtools/localcluster/pbs.py); logs under build/openpbs/logs.
# A second run with the same source and patches does nothing (stamp keyed on their sha256).
# Needs root only for the Debian packages (scripts/setup-machine.sh installs them with
# MALLETRAIN_PBS=1) and for running the complex, not for the build itself.
# MALLETRAIN_OPENPBS_VENDOR overrides the source folder; MALLETRAIN_OPENPBS_JOBS the make -j.
set -euo pipefail
cd "$(dirname "$0")/.."
vendor=${MALLETRAIN_OPENPBS_VENDOR:-../shared/vendor/openpbs}
jobs=${MALLETRAIN_OPENPBS_JOBS:-$(nproc)}
tarball="$vendor/openpbs-23.06.06.tar.gz"
patches=("$vendor/0001-compile-with-python-3.11.patch" "$vendor/0002-python-3.10-support.patch")
for f in "$tarball" "${patches[@]}"; do
  [ -f "$f" ] || { echo "build-openpbs: $f is missing; put the OpenPBS source beside the checkout (../shared/vendor/openpbs) or set MALLETRAIN_OPENPBS_VENDOR" >&2; exit 2; }
done
vendor=$(cd "$vendor" && pwd)
tarball="$vendor/openpbs-23.06.06.tar.gz"
patches=("$vendor/0001-compile-with-python-3.11.patch" "$vendor/0002-python-3.10-support.patch")
# Debian's Python: hooks run in the server's embedded interpreter, which must be the system one.
py=/usr/bin/python3
[ -x "$py" ] || { echo "build-openpbs: $py is missing; install python3 and python3-dev (apt)" >&2; exit 2; }

top=build/openpbs
key=$(cat "$tarball" "${patches[@]}" | sha256sum | cut -c1-16)
stamp="$top/.built-$key"
prefix="$(pwd)/$top/install"
if [ -f "$stamp" ] && [ -x "$prefix/sbin/pbs_server.bin" ]; then
  exit 0
fi

# Only the system tool chain: a Python first on PATH (pyenv, a venv) must not be picked up.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
rm -rf "$top"
mkdir -p "$top/src" "$top/logs"
logs="$(pwd)/$top/logs"
tar -xzf "$tarball" -C "$top/src" --strip-components=1
cd "$top/src"
for p in "${patches[@]}"; do
  patch -p1 -s < "$p"
done
run() {  # run STEP CMD...: niced, output to logs/STEP.log, timed
  local step=$1 t0; shift
  t0=$(date +%s)
  if ! nice -n 10 "$@" > "$logs/$step.log" 2>&1; then
    echo "build-openpbs: $step failed; last lines of $top/logs/$step.log:" >&2
    tail -20 "$logs/$step.log" >&2
    exit 1
  fi
  echo "build-openpbs: $step $(( $(date +%s) - t0 )) s"
}
echo "build-openpbs: building OpenPBS 23.06.06 into $top/install (about 5 min on 2 cores)"
run autogen ./autogen.sh
run configure ./configure --prefix="$prefix" PYTHON="$py"
run make make -j"$jobs"
run install make install
cd ../../..
touch "$stamp"
