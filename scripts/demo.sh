#!/usr/bin/env bash
# The demo: for now a short live preview on a real local Slurm cluster (see demo_preview.py).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" scripts/demo_preview.py "$@"
