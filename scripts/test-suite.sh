#!/usr/bin/env bash
# The whole suite (`make test`), in three pytest runs, each with its own summary and time:
#
#   part 1: everything outside tests/slurm: unit, property and simulator tests, real torch,
#           the real-PBS tier;
#   side:   at the same time, the Slurm modules that start a cluster of their own and spend
#           their time waiting on Slurm's clock (site-default timings, a two-minute hole,
#           usage charged at a job's end), not on the CPU;
#   part 2: once both have ended, tests/slurm on the session's cluster.
#
# The side modules never overlap part 2: their clusters' job ids start at 1 like the session
# cluster's, and the fault helpers find a job's processes by SLURM_JOB_ID.
# The exit status is 0 when every part passed (pytest's 5, "no tests", counts as passed).
set -uo pipefail
cd "$(dirname "$0")/.."

read -r -a PYTEST <<< "${PYTEST:-${PYTHON:-python3} -m pytest}"
SIDE=(tests/slurm/test_site_defaults.py tests/slurm/test_epilog_margin.py
      tests/slurm/test_charging.py tests/slurm/test_accounting.py)
LOGS=build/test-logs
mkdir -p "$LOGS"

passed() { [ "$1" -eq 0 ] || [ "$1" -eq 5 ]; }
failed=()
t_all=$(date +%s)

echo "== part 1: tests outside tests/slurm; beside it, ${#SIDE[@]} own-cluster Slurm modules (log: $LOGS/side.log)"
t0=$(date +%s)
"${PYTEST[@]}" -q --durations=15 "${SIDE[@]}" > "$LOGS/side.log" 2>&1 &
side=$!
"${PYTEST[@]}" -q --durations=20 tests --ignore=tests/slurm
rc=$?
passed "$rc" || failed+=("part 1 (exit $rc)")
echo "== part 1: $(( $(date +%s) - t0 )) s; waiting for the own-cluster Slurm modules"
wait "$side"
rc=$?
echo "== the own-cluster Slurm modules ($(( $(date +%s) - t0 )) s from the start of part 1):"
cat "$LOGS/side.log"
passed "$rc" || failed+=("the own-cluster Slurm modules (exit $rc)")

echo "== part 2: tests/slurm on the session's cluster"
t0=$(date +%s)
ignore=()
for m in "${SIDE[@]}"; do ignore+=("--ignore=$m"); done
"${PYTEST[@]}" -q --durations=50 tests/slurm "${ignore[@]}"
rc=$?
passed "$rc" || failed+=("part 2 (exit $rc)")
echo "== part 2: $(( $(date +%s) - t0 )) s"

echo "== the whole suite: $(( $(date +%s) - t_all )) s"
if [ "${#failed[@]}" -gt 0 ]; then
    printf 'failed: %s\n' "${failed[@]}"
    exit 1
fi
