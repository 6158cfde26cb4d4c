#!/usr/bin/env bash
# Runs a test binary as an MPI job: tests/mpirun_test.sh RANKS BINARY [ARGS...]. For Bazel's
# sh_test (see mpi_test in tests.bzl) and by hand. --oversubscribe lets 4 ranks share 2 cores.
set -euo pipefail
ranks=$1
binary=$2
shift 2
# OpenMPI refuses to run as root unless told it may (CI and containers run as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# A short collective timeout: a test that leaves a rank behind fails in seconds, not minutes.
export AMPGRAD_DISTRIBUTED_TIMEOUT=${AMPGRAD_DISTRIBUTED_TIMEOUT:-30}
# OpenMPI keeps its session files under TMPDIR; Bazel gives each test its own.
export TMPDIR=${TEST_TMPDIR:-${TMPDIR:-/tmp}}
# Its shared-memory transport (vader) crashed in Bazel's sandbox with its backing file in the
# default /dev/shm; a file under the test's own TMPDIR works. (The sandbox keeps the loopback
# interface that mpirun needs, so these tests need no "no-sandbox" tag.)
export OMPI_MCA_btl_vader_backing_directory=$TMPDIR
# Under --config=asan: OpenMPI (and NCCL) leave allocations behind at exit, many from plugins
# already unloaded, whose frames no suppression can name; so the MPI jobs check everything but
# leaks (the single-process tests keep leak checking).
if [[ -n "${ASAN_OPTIONS:-}" ]]; then export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"; fi
# Bazel's per-test files would be written by every rank at once; the wrapper's status is the result.
unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE TEST_SHARD_STATUS_FILE
# The job as a whole is bounded too, so a hang can never outlive the test.
exec timeout --signal=TERM --kill-after=10 240 \
  mpirun --oversubscribe --bind-to none -np "$ranks" "$binary" "$@"
