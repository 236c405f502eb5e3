#!/usr/bin/env bash
# Start a real one-host Slurm cluster of N virtual nodes (one slurmd each) for MalleTrain.
#
#   slurm_conf/local/start.sh [N=16] [--accounting] [--site-defaults] [--root DIR] [--port-base P]
#                             [--slurm 22.05|24.11|25.11]
#
# --accounting     MariaDB + slurmdbd, a `malletrain` QOS and preempt/qos (installs
#                  mariadb-server, slurmdbd, slurm-wlm-mysql-plugin through
#                  scripts/setup-machine.sh with MALLETRAIN_ACCOUNTING=1 when missing).
# --site-defaults  Slurm's site timings (cred_expire=120, bf_interval=30, batch_sched_delay=3,
#                  KillWait=30) instead of the test-friendly ones (10, 1, 0, 2).
# --slurm          the Slurm release (default $MALLETRAIN_SLURM, else the host's 22.05); 24.11 and
#                  25.11 come from scripts/setup-slurm-matrix.sh (a trixie chroot, as root).
# Root directory: --root, else $MALLETRAIN_CLUSTER_DIR, else .cluster in the checkout.
# Ports: slurmctld = base, slurmdbd = base+1, MariaDB = base+2, node i = base+2+i; the base is
# --port-base, else $MALLETRAIN_PORT_BASE, else a free one chosen at random.
# Idempotent: a second start with the same settings says it is running. Prints its timings.
# Then: `. <root>/env.sh` points sbatch/squeue/scontrol at the cluster; stop.sh stops it.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
args=()
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then args+=(--nodes "$1"); shift; fi
for a in "$@"; do
  if [[ $a == --accounting ]] && ! command -v slurmdbd >/dev/null; then
    MALLETRAIN_ACCOUNTING=1 MALLETRAIN_SKIP_PIP=1 bash "$repo/scripts/setup-machine.sh"
  fi
done
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m devtools.localcluster start "${args[@]}" "$@"
