#!/usr/bin/env bash
# The demo: elastic NAS-cell training on the idle nodes of a 16-node local Slurm cluster
# (see scripts/demo.py; results in demo-output/).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" scripts/demo.py "$@"
