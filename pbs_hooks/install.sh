#!/usr/bin/env bash
# Install or update MalleTrain's PBS hooks (PBS manager privilege). Idempotent: a hook that
# exists is updated in place, so run it again after every upgrade. See docs/pbs.md.
#
#   install.sh [--socket PATH] [--entry-queue NAME] [--queue NAME] [--max-nodes N]
#              [--resv-margin-s S] [--freq S] [--job-key-file PATH] [--uninstall]
#
# --job-key-file (sites without munge): also install mt_launch, which gives each job its
# launcher secret; the key file is created (root-only) when missing; malletraind reads the same
# file ([pbs] job_key_file).
#
# QMGR names the qmgr binary (default: qmgr on PATH).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
script="$here/malletrain_pbs.py"
qmgr=${QMGR:-qmgr}
socket=/run/malletrain/hook.sock
entry_queue=malletrain
queue=mt_preemptable
max_nodes=0
resv_margin_s=3600
freq=30
job_key_file=
uninstall=0

die() { echo "install.sh: $*" >&2; exit 2; }
whole() { [[ $2 =~ ^[0-9]+$ ]] || die "$1 must be a whole number, got '$2'"; }
name() { [[ $2 =~ ^[A-Za-z][A-Za-z0-9_.-]*$ ]] || die "$1 must be a PBS name, got '$2'"; }

while [[ $# -gt 0 ]]; do
    case $1 in
        --socket) socket=${2:?--socket needs a path}; shift 2 ;;
        --entry-queue) entry_queue=${2:?--entry-queue needs a name}; shift 2 ;;
        --queue) queue=${2:?--queue needs a name}; shift 2 ;;
        --max-nodes) max_nodes=${2:?--max-nodes needs a number}; shift 2 ;;
        --resv-margin-s) resv_margin_s=${2:?--resv-margin-s needs seconds}; shift 2 ;;
        --freq) freq=${2:?--freq needs seconds}; shift 2 ;;
        --job-key-file) job_key_file=${2:?--job-key-file needs a path}; shift 2 ;;
        --uninstall) uninstall=1; shift ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) die "unknown option '$1'; see --help" ;;
    esac
done
whole --max-nodes "$max_nodes"; whole --resv-margin-s "$resv_margin_s"; whole --freq "$freq"
name --entry-queue "$entry_queue"; name --queue "$queue"
[[ $socket == /* && $socket != *'"'* && $socket != *\\* ]] \
    || die "--socket must be an absolute path without quotes or backslashes"
command -v "$qmgr" >/dev/null || die "$qmgr not found; run this on the PBS server host"
[[ -r $script ]] || die "$script is missing; run install.sh from the MalleTrain sources"
[[ $script != *[[:space:]]* ]] || die "qmgr cannot import from a path with blanks: copy pbs_hooks/ elsewhere"

# hook name, event(s), alarm (s): the hint hooks must never make PBS wait.
hooks=(
    "mt_queuejob queuejob 10"
    "mt_periodic periodic 20"
    "mt_modifyvnode modifyvnode 5"
    "mt_jobobit jobobit 5"
    "mt_postqueuejob postqueuejob 5"
    "mt_modifyjob modifyjob,movejob 5"
    "mt_epilogue execjob_preterm,execjob_epilogue 10"
)

q() { "$qmgr" -c "$*"; }
exists() { "$qmgr" -c "list hook $1" >/dev/null 2>&1; }

if [[ $uninstall == 1 ]]; then
    for spec in "${hooks[@]}" "mt_launch execjob_launch 10"; do
        read -r hook _ _ <<<"$spec"
        if exists "$hook"; then q "delete hook $hook"; fi
    done
    exit 0
fi

workdir=$(mktemp -d)
trap 'rm -rf "$workdir"' EXIT
config="$workdir/malletrain.json"
cat >"$config" <<EOF
{"socket": "$socket", "entry_queue": "$entry_queue", "queue": "$queue",
 "max_nodes": $max_nodes, "resv_margin_s": $resv_margin_s}
EOF

for spec in "${hooks[@]}"; do
    read -r hook event alarm <<<"$spec"
    exists "$hook" || q "create hook $hook"
    if [[ $event == *,* ]]; then event="\"$event\""; fi  # qmgr wants a list quoted
    q "set hook $hook event = $event"
    q "set hook $hook alarm = $alarm"
    if [[ $event == periodic ]]; then q "set hook $hook freq = $freq"; fi
    q "import hook $hook application/x-python default $script"
    q "import hook $hook application/x-config default $config"
    q "set hook $hook enabled = true"
done
installed="mt_queuejob mt_periodic mt_modifyvnode mt_jobobit mt_postqueuejob mt_modifyjob mt_epilogue"
if [[ -n $job_key_file ]]; then
    [[ $job_key_file == /* ]] || die "--job-key-file must be an absolute path"
    if [[ ! -e $job_key_file ]]; then
        (umask 077; od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$job_key_file")
    fi
    key=$(tr -d ' \n' <"$job_key_file")
    [[ $key =~ ^[0-9a-f]{64,}$ ]] || die "$job_key_file must hold a hex key of 32+ bytes"
    launch_config="$workdir/malletrain-launch.json"
    (umask 077; sed "s/}\$/, \"job_key\": \"$key\"}/" "$config" >"$launch_config")
    exists mt_launch || q "create hook mt_launch"
    q "set hook mt_launch event = execjob_launch"
    q "set hook mt_launch alarm = 10"
    q "import hook mt_launch application/x-python default $script"
    q "import hook mt_launch application/x-config default $launch_config"
    q "set hook mt_launch enabled = true"
    installed="$installed mt_launch"
fi
echo "MalleTrain PBS hooks installed: $installed"
