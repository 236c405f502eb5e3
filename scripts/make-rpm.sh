#!/usr/bin/env bash
# Build MalleTrain's RPM as a site does: a release tarball with malletrain.spec inside, then
# `rpmbuild -ta` on it. Writes the tarball to TOPDIR/SOURCES/ and the RPM to
# TOPDIR/RPMS/noarch/ (TOPDIR: dist/rpm) and prints the RPM's path last. Any rpmbuild works (RHEL's, SUSE's, Debian's `rpm` package).
#
#   scripts/make-rpm.sh [--python PATH] [--topdir DIR] [--release N]
#
# --python: the site's Python the package is built for (default: python3 on PATH, resolved).
# --release: the package's release number (default 1; a rebuild of the same version is N+1).
# The tarball holds the checkout's files as they are now (tracked and new, not ignored ones).
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(command -v python3 || true)
topdir=$PWD/dist/rpm
release=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --python) python=${2:?--python needs a path}; shift 2 ;;
    --topdir) topdir=${2:?--topdir needs a folder}; shift 2 ;;
    --release) release=${2:?--release needs a number}; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "make-rpm.sh: unknown option '$1'; see --help" >&2; exit 2 ;;
  esac
done
command -v rpmbuild >/dev/null || { echo "make-rpm.sh: no rpmbuild: install rpm-build (RHEL, SUSE) or rpm (Debian: apt-get install rpm)" >&2; exit 2; }
[[ $release =~ ^[0-9]+$ ]] || { echo "make-rpm.sh: --release must be a whole number, got '$release'" >&2; exit 2; }
[ -n "$python" ] || { echo "make-rpm.sh: no python3 on PATH; pass --python PATH" >&2; exit 2; }
# the interpreter itself, not a shim (pyenv) or a venv link that may go away
python=$("$python" -c 'import os, sys; print(os.path.realpath(sys.executable))')
version=$(sed -n 's/^Version: *//p' malletrain.spec)
pkg_version=$("$python" -c 'import ast, sys; t = ast.parse(open("malletrain_core/__init__.py").read()); print([n.value.value for n in t.body if isinstance(n, ast.Assign) and n.targets[0].id == "__version__"][0])')
[ "$version" = "$pkg_version" ] || { echo "make-rpm.sh: malletrain.spec says Version $version, malletrain_core says $pkg_version: make them equal" >&2; exit 2; }
mkdir -p "$topdir/SOURCES"
topdir=$(cd "$topdir" && pwd)
tarball=$topdir/SOURCES/malletrain-$version.tar.gz
if git rev-parse --git-dir >/dev/null 2>&1; then
  git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
    case $f in build|build/*|dist|dist/*) continue ;; esac  # a link to shared build caches
    [ -e "$f" ] && printf '%s\0' "$f"; done \
    | tar --null -T - --transform "s|^|malletrain-$version/|" --owner=0 --group=0 -czf "$tarball"
else  # an unpacked release tarball
  tar --exclude=./dist --exclude=./build --exclude="./${topdir#"$PWD"/}" --transform "s|^\./|malletrain-$version/|" \
      --owner=0 --group=0 -czf "$tarball" .
fi
# Where the RPM database does not know rpm itself (Debian's rpm package), it knows no installed
# package, so build dependencies cannot be checked.
nodeps=()
# Nor has rpm's Python helper for the package's "provides" what it needs there.
rpm -q rpm >/dev/null 2>&1 || nodeps=(--nodeps --define "__pythondist_provides %{nil}")
rpmbuild -ta "$tarball" --define "_topdir $topdir" --define "__python3 $python" \
  --define "mt_release $release" --quiet "${nodeps[@]}"
echo "$topdir/RPMS/noarch/malletrain-$version-$release.noarch.rpm"
