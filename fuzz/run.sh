#!/usr/bin/env bash
# Builds the safetensors fuzzer with clang++ (libFuzzer + ASan + UBSan) and runs it for a bounded
# time over fuzz/corpus/safetensors. Usage: fuzz/run.sh [seconds, default 60] [extra libFuzzer flags]
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
cxx=${CXX_FUZZ:-$(command -v clang++-14 || command -v clang++ || echo clang++-14)}
out=${FUZZ_OUT:-${TMPDIR:-/tmp}/ampgrad_fuzz}
mkdir -p "$out/corpus"

# The parser and the framework pieces it uses (Tensor, allocator, copies); no CUDA (the *_cuda.cc
# host files need the CUDA runtime), no Bazel.
# nlohmann/json comes from /usr/include (Debian nlohmann-json3-dev), already a system path.
framework_sources=()
for f in framework/*.cc; do [[ "$f" == *_cuda.cc ]] || framework_sources+=("$f"); done
"$cxx" -std=c++20 -O1 -g -fno-omit-frame-pointer -Wall -Wextra \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -I. \
  fuzz/safetensors_fuzz.cc checkpoint/safetensors.cc checkpoint/safetensors_dtypes.cc "${framework_sources[@]}" \
  -o "$out/safetensors_fuzz"

# New inputs go to a scratch corpus; the committed seeds stay as they are. Crashes land in $out.
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
"$out/safetensors_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
  -print_final_stats=1 -artifact_prefix="$out/" "$@" "$out/corpus" fuzz/corpus/safetensors
