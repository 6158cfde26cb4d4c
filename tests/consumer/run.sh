#!/usr/bin/env bash
# Builds and runs tests/consumer (a workspace that uses ampgrad only through deps.bzl, as
# docs/using.md shows) from a fresh, temporary output base: once with the CUDA toolkit as found,
# once CPU-only.
# Usage: tests/consumer/run.sh [extra bazel build flags, e.g. --disk_cache= for a cold build]
set -euo pipefail
cd "$(dirname "$0")"
bazelw=../../bazelw

base=""
cleanup() {
  if [[ -n "$base" ]]; then
    "$bazelw" --output_base="$base" clean --expunge >/dev/null 2>&1 || true
    chmod -R u+w "$base" 2>/dev/null || true  # Bazel leaves read-only folders if the clean failed
    rm -rf "$base"
  fi
}
trap cleanup EXIT

# run_mode NAME EXPECTED_CUDA_FOUND [bazel flags]: build and run //:seed in a new output base, with
# the variables in env_vars set; check what @local_cuda found and what the program printed.
run_mode() {
  local name=$1 expected=$2
  shift 2
  local start=$SECONDS
  base=$(mktemp -d "${TMPDIR:-/tmp}/ampgrad_consumer.XXXXXX")
  # --symlink_prefix=/: no bazel-* links in the tree, pointing at an output base about to go.
  local flags=(--symlink_prefix=/ --nosandbox_debug --noshow_progress "$@")
  env "${env_vars[@]}" "$bazelw" --output_base="$base" build "${flags[@]}" //:seed
  local found
  found=$(sed -n 's/^CUDA_FOUND = //p' "$base/external/local_cuda/defs.bzl")
  if [[ "$found" != "$expected" ]]; then
    echo "consumer ($name): @local_cuda has CUDA_FOUND = $found, expected $expected" >&2
    exit 1
  fi
  local out
  out=$("$(env "${env_vars[@]}" "$bazelw" --output_base="$base" info "${flags[@]}" bazel-bin 2>/dev/null)/seed")
  echo "$out"
  if ! grep -Eq '^device (cpu|cuda) loss [0-9]+\.[0-9]+ ' <<<"$out"; then
    echo "consumer ($name): the seed program printed no loss" >&2
    exit 1
  fi
  # Only //:ampgrad is public: depending on an internal library must fail analysis.
  local err
  if err=$(env "${env_vars[@]}" "$bazelw" --output_base="$base" build "${flags[@]}" --nobuild //:internal_dep 2>&1); then
    echo "consumer ($name): @ampgrad//framework is visible outside ampgrad" >&2
    exit 1
  elif ! grep -q "is not visible from target" <<<"$err"; then
    echo "$err" >&2
    echo "consumer ($name): //:internal_dep failed, but not on visibility" >&2
    exit 1
  fi
  cleanup
  base=""
  echo "consumer ($name): OK in $((SECONDS - start)) s (CUDA_FOUND = $found)"
}

# The toolkit cuda_configure.bzl would find: $CUDA_PATH, then $CUDA_HOME, then /usr/local/cuda.
toolkit=${CUDA_PATH:-${CUDA_HOME:-/usr/local/cuda}}
if [[ -x "$toolkit/bin/nvcc" ]]; then
  env_vars=()
  run_mode "CUDA toolkit at $toolkit" True "$@"
else
  echo "consumer: no CUDA toolkit at $toolkit; the CUDA build is skipped"
fi
env_vars=(CUDA_PATH=/nonexistent)
run_mode "CPU only" False "$@"
