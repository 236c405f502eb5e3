#!/usr/bin/env bash
# Create the `malletrain` QOS for sites whose preemption is QOS-based (PreemptType=preempt/qos,
# slurmdbd). Idempotent: run it again after adding users or preempting QOSes.
#
#   qos-setup.sh [--dry-run] [--qos NAME] [--preemptor QOS]... [USER]...
#
# --qos NAME        the elastic QOS (default malletrain; the name job_submit.lua's QOS_NAME holds)
# --preemptor QOS   a QOS whose jobs may take nodes back from elastic tasks (default: normal);
#                   repeat for each production QOS. Every one of them gets Preempt+=NAME.
# USER...           users allowed to submit elastic jobs (their associations get qos+=NAME;
#                   without it sbatch says "Invalid qos specification").
# --dry-run         print the sacctmgr commands instead of running them.
#
# The QOS: PreemptMode=requeue (a preempted task goes back to the queue, and the daemon keeps
# it held), GraceTime=0 (production jobs never wait: workers exit at once on SIGTERM and
# checkpoint periodically instead), Priority=0 (never ahead of production work).
set -euo pipefail
qos=malletrain
preemptors=()
users=()
dry=0
while [ $# -gt 0 ]; do
  case $1 in
    --qos) qos=${2:?--qos needs a name}; shift 2 ;;
    --preemptor) preemptors+=("${2:?--preemptor needs a QOS}"); shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "qos-setup.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) users+=("$1"); shift ;;
  esac
done
[ ${#preemptors[@]} -gt 0 ] || preemptors=(normal)

run() {
  if [ $dry = 1 ]; then echo "$*"; else "$@"; fi
}
if [ $dry = 0 ] && ! command -v sacctmgr >/dev/null; then
  echo "qos-setup.sh: sacctmgr not found: QOS need slurmdbd (see slurm_conf/README.md)" >&2
  exit 1
fi

if [ $dry = 1 ] || [ -z "$(sacctmgr -n -P show qos "$qos" format=name 2>/dev/null)" ]; then
  run sacctmgr -i add qos "$qos"
fi
run sacctmgr -i modify qos where name="$qos" set PreemptMode=requeue GraceTime=0 Priority=0
for p in "${preemptors[@]}"; do
  run sacctmgr -i modify qos where name="$p" set Preempt+="$qos"
done
for u in "${users[@]}"; do
  run sacctmgr -i modify user where name="$u" set qos+="$qos"
done
