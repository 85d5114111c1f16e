#!/usr/bin/env bash
# The whole suite on a many-core GPU machine, after scripts/gpu_setup.sh: pytest-xdist workers pinned
# to 2 cores each (scripts/pytest_gpu_machine.py), stopped after SUITE_S seconds (default 3000), every
# process it started ended. Logs in LOGS (default .): suite.log (each test's outcome as it ends) and
# failures.log (each failure's report as it happens, kept when the time limit stops the run).
#     bash scripts/gpu_suite.sh [PYTEST ARGS...]     # WORKERS=8 PIN_CORES_EACH=2 SUITE_S=3000 LOGS=.
set -u
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
logs=${LOGS:-.}
workers=${WORKERS:-$(( $(nproc) / ${PIN_CORES_EACH:-2} ))}
export FAILURES_LOG="$logs/failures.log" PYTHONPATH="$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}"
: > "$FAILURES_LOG"
# A session of its own, so the time limit ends every worker, server and torchrun it started.
setsid "$python" -m pytest -p pytest_gpu_machine -n "$workers" -p no:cacheprovider -v -rfEs --durations=25 "$@" \
  > "$logs/suite.log" 2>&1 &
pid=$!
( sleep "${SUITE_S:-3000}"; kill -TERM -- -"$pid" 2>/dev/null; sleep 5; kill -KILL -- -"$pid" 2>/dev/null ) &
timer=$!
wait "$pid"; rc=$?
kill "$timer" 2>/dev/null
kill -KILL -- -"$pid" 2>/dev/null  # whatever a test left running
count() { grep -c "\] $1 " "$logs/suite.log"; }
echo "gpu_suite.sh: pytest exit $rc; passed $(count PASSED), failed $(count FAILED), errors $(count ERROR)," \
     "skipped $(count SKIPPED) ($([ $rc -eq 143 ] || [ $rc -eq 137 ] && echo "stopped at ${SUITE_S:-3000} s" || echo finished))"
grep '^==== ' "$FAILURES_LOG" | cut -c1-240
exit "$rc"
