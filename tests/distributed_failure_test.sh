#!/usr/bin/env bash
# A rank that throws, hangs or dies must end the whole MPI job with a clear error in bounded time.
# Usage: distributed_failure_test.sh MPIRUN_TEST_SH DDP_FAILURE_PROG (as the sh_test passes them).
set -uo pipefail
mpirun_test=$1
prog=$2
failures=0

# run NAME TIMEOUT MAX_SECONDS EXPECTED_STATUS NEEDLE...: runs `prog NAME` on 2 ranks with the
# collective timeout TIMEOUT; checks the exit status (0, or "nonzero"), the time taken and that the
# output contains every NEEDLE.
run() {
  local mode=$1 timeout=$2 max_seconds=$3 expected=$4
  shift 4
  local start end status out
  start=$(date +%s)
  out=$(AMPGRAD_DISTRIBUTED_TIMEOUT=$timeout "$mpirun_test" 2 "$prog" "$mode" 2>&1)
  status=$?
  end=$(date +%s)
  local ok=1
  if [[ $expected == 0 && $status -ne 0 ]] || [[ $expected == nonzero && $status -eq 0 ]]; then ok=0; fi
  if (( status == 124 )); then ok=0; fi  # the wrapper's own bound ran out: a hang
  if (( end - start > max_seconds )); then ok=0; fi
  for needle in "$@"; do
    grep -qF -- "$needle" <<<"$out" || { ok=0; echo "missing: $needle"; }
  done
  if (( ok )); then
    echo "PASS $mode: status $status in $((end - start)) s"
  else
    echo "FAIL $mode: status $status in $((end - start)) s (expected $expected, at most $max_seconds s)"
    echo "$out" | tail -n 40
    failures=$((failures + 1))
  fi
}

run none 30 60 0 "rank 0 finished" "rank 1 finished"
# The thrower's message reaches the job's output, and mpirun ends the job at once (well within
# the 30 s collective timeout the other rank would otherwise wait out).
run throw 30 25 nonzero "rank 1: error:" "injected failure on rank 1 at step 3"
# The rank that keeps waiting times out after 3 s with a clear error, and the job ends.
run hang 3 25 nonzero "rank 0: error:" "did not complete within 3 s" "AMPGRAD_DISTRIBUTED_TIMEOUT"
run kill 30 25 nonzero "rank 1 with PID"
# A rank that starts 5 s late is waited for: start-up has its own deadline (300 s by default),
# not the 3 s collective timeout.
run late 3 60 0 "rank 0 finished" "rank 1 finished"

(( failures == 0 )) || { echo "$failures scenario(s) failed"; exit 1; }
