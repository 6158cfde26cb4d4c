#!/usr/bin/env bash
# GPU check in two halves, for GPU machines that have no Bazel.
#   tools/gpu_check.sh build   (here, with the CUDA toolkit): builds the CUDA test binaries fully
#                              statically linked against ampgrad (only libcublas/libcublasLt and the
#                              driver stay shared) and copies them with this script into the
#                              git-ignored .gpu_build/ (a few MB; ship that folder).
#   tools/gpu_check.sh run     (on the GPU machine, from .gpu_build/ or the repo root): points
#                              LD_LIBRARY_PATH at a libcublas.so.13 found on the machine, runs each
#                              binary with a timeout and prints a summary table last.
# Env: GPU_CHECK_TIMEOUT (seconds per binary, default 300).
set -uo pipefail

mode="${1:-}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# The CUDA test and benchmark binaries.
targets=(//tests:cuda_test //bench:cuda_bench)

build() {
  local root out
  root="$(cd "$here/.." && pwd)"
  out="$root/.gpu_build"
  cd "$root" || exit 1
  # --dynamic_mode=off: link ampgrad's libraries into the binary instead of Bazel's _solib .so files.
  bazel build --dynamic_mode=off "${targets[@]}" || exit 1
  rm -rf "$out" && mkdir -p "$out/bin"
  for t in "${targets[@]}"; do
    local path="bazel-bin/${t#//}"
    path="${path/://}"
    cp -f "$path" "$out/bin/" || exit 1
    chmod u+w "$out/bin/$(basename "$path")"
  done
  cp -f "$here/gpu_check.sh" "$out/gpu_check.sh"
  # The OpenMP runtime the CPU kernels use, in case the GPU machine lacks it.
  mkdir -p "$out/lib"
  local gomp
  gomp="$(ldd "$out"/bin/* 2>/dev/null | awk '/libgomp/ {print $3; exit}')"
  [[ -n "$gomp" ]] && cp -fL "$gomp" "$out/lib/"
  du -sh "$out"
  echo "ship $out to the GPU machine and run: bash gpu_check.sh run"
}

run() {
  local bindir lib
  if [[ -d "$here/bin" ]]; then bindir="$here/bin"; else bindir="$here/../.gpu_build/bin"; fi
  [[ -d "$bindir" ]] || { echo "no binaries in $bindir; run 'tools/gpu_check.sh build' first" >&2; exit 1; }
  lib="$(find / -name 'libcublas.so.13*' -not -path '/proc/*' 2>/dev/null | head -n 1)"
  if [[ -n "$lib" ]]; then
    export LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "cuBLAS: $(dirname "$lib")"
  else
    echo "warning: no libcublas.so.13 found; the binaries will fail to load" >&2
  fi
  export LD_LIBRARY_PATH="$bindir/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
  local rows=() failed=0
  for bin in "$bindir"/*; do
    [[ -x "$bin" ]] || continue
    local name log start rc secs status summary
    name="$(basename "$bin")"
    log="$(mktemp)"
    start=$(date +%s)
    timeout "${GPU_CHECK_TIMEOUT:-300}" "$bin" >"$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    tail -n 40 "$log"
    summary="$(grep -E '^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ test|^targets:' "$log" | tr '\n' ' ')"
    case $rc in
      0) status=ok ;;
      124) status=TIMEOUT; failed=1 ;;
      *) status="FAIL($rc)"; failed=1 ;;
    esac
    rows+=("$(printf '%-24s %-10s %6ss  %s' "$name" "$status" "$secs" "$summary")")
    rm -f "$log"
  done
  echo
  echo "==== GPU check summary ===="
  printf '%-24s %-10s %7s  %s\n' binary status time tests
  printf '%s\n' "${rows[@]}"
  exit $failed
}

case "$mode" in
  build) build ;;
  run) run ;;
  *) echo "usage: $0 build|run" >&2; exit 2 ;;
esac
