#!/usr/bin/env bash
# Stop the cluster that start.sh started under the same root: cancel its jobs, then stop each
# daemon named by its PID files (checked to be that cluster's), leftover slurmstepds included.
# Nothing else on the host is touched. Prints how long it took.
#
#   slurm_conf/local/stop.sh [--root DIR]      (default: $MALLETRAIN_CLUSTER_DIR, else .cluster)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m devtools.localcluster stop "$@"
