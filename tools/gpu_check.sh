#!/usr/bin/env bash
# GPU check in two halves, for GPU machines that have no Bazel.
#   tools/gpu_check.sh build   (here, with the CUDA toolkit): builds the CUDA test and benchmark
#                              binaries with ampgrad, libstdc++, zlib and the CUDA runtime linked in
#                              statically; they need only glibc (>= the floor printed and stored in
#                              BUILD_INFO), libgcc_s, and at run time the driver and libcublas.so.13
#                              (loaded with dlopen). Copies them and this script into the
#                              git-ignored .gpu_build/ (a few MB; ship that folder).
#   tools/gpu_check.sh run     (on the GPU machine, from .gpu_build/ or the repo root): checks with
#                              ldd that every binary loads, finds libcublas.so.13 (Python's CUDA 13
#                              wheels, then ldconfig, then /usr/local/cuda*; never a walk of /), runs
#                              every binary with AMPGRAD_REQUIRE_CUDA=1 (a skipped CUDA test is a
#                              failure) and the tests once more with AMPGRAD_CUDA_SYNC=1, keeps the
#                              logs and prints a summary table last. Exit status 0 only if all pass.
# Env: GPU_CHECK_TIMEOUT (seconds per binary, default 240), GPU_CHECK_LOGS (log folder, default
# logs/ beside the binaries).
set -uo pipefail

mode="${1:-}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# The CUDA test and benchmark binaries, in the order they run.
targets=(//tests:cuda_test //tests:cuda_kernels_test //bench:cuda_bench)

# The newest glibc symbol version the binaries in $1 need: the oldest glibc they run on.
glibc_floor() {
  objdump -T "$1"/* 2>/dev/null | grep -o 'GLIBC_[0-9][0-9.]*' | sort -uV | tail -n 1 | sed 's/GLIBC_//'
}

build() {
  local root out
  root="$(cd "$here/.." && pwd)"
  out="$root/.gpu_build"
  cd "$root" || exit 1
  # --dynamic_mode=off: ampgrad's libraries go into each binary, not into Bazel's _solib .so files.
  # Bazel's toolchain ends the link line with -lstdc++; -l:libstdc++.a before it (with --as-needed)
  # links libstdc++ statically, so the GPU machine needs no GLIBCXX_3.4.30. libgcc_s stays shared
  # (present everywhere, old symbol versions): -static-libgcc would raise the glibc floor to 2.35
  # (_dl_find_object in its unwinder). --define=gpu_bundle=1 links tools/glibc_compat.cc, whose
  # arc4random keeps static libstdc++ from needing glibc 2.36.
  bazel build --dynamic_mode=off --define=gpu_bundle=1 --linkopt=-Wl,--as-needed --linkopt=-l:libstdc++.a \
    "${targets[@]}" || exit 1
  rm -rf "$out" && mkdir -p "$out/bin"
  for t in "${targets[@]}"; do
    local path="bazel-bin/${t#//}"
    path="${path/://}"
    cp -f "$path" "$out/bin/" || exit 1
    chmod u+w "$out/bin/$(basename "$path")"
  done
  cp -f "$here/gpu_check.sh" "$out/gpu_check.sh"
  local floor
  floor="$(glibc_floor "$out/bin")"
  {
    echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
    echo "built $(date -u +%Y-%m-%dT%H:%MZ) on $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), $(ldd --version | head -n 1)"
    echo "glibc floor $floor"
  } >"$out/BUILD_INFO"
  echo "shared libraries the binaries need:"
  ldd "$out"/bin/* | awk '/=>/ {print "  " $1}' | sort -u
  # Only glibc's own libraries and libgcc_s may stay shared (libstdc++ and zlib are linked in).
  local extra
  extra="$(ldd "$out"/bin/* | awk '/=>/ {print $1}' | sort -u |
           grep -Ev '^(libc|libm|libdl|libpthread|librt|libgcc_s)\.so\.[0-9]+$')"
  if [[ -n "$extra" ]]; then
    echo "error: the bundle needs shared libraries a GPU machine may lack:" $extra >&2
    exit 1
  fi
  cat "$out/BUILD_INFO"
  du -sh "$out"
  echo "ship $out to the GPU machine and run: bash gpu_check.sh run"
}

# Prints the folder holding libcublas.so.13, looking only where it is installed: the CUDA 13 Python
# wheels of the python on PATH (site-packages/nvidia/cu13/lib, or nvidia/cublas/lib), the dynamic
# linker's cache, then the toolkits under /usr/local.
find_cublas() {
  local py dir
  for py in python3 python; do
    command -v "$py" >/dev/null 2>&1 || continue
    dir="$(timeout 30 "$py" - <<'EOF' 2>/dev/null
import glob, os, site, sys
roots = list(sys.path)
try:
    roots += site.getsitepackages() + [site.getusersitepackages()]
except AttributeError:
    pass
try:
    import nvidia
    roots += [os.path.dirname(p) for p in nvidia.__path__]
except ImportError:
    pass
for root in roots:
    for sub in ("nvidia/cu13/lib", "nvidia/cublas/lib"):
        if glob.glob(os.path.join(root, sub, "libcublas.so.13*")):
            print(os.path.join(root, sub))
            sys.exit(0)
EOF
)"
    [[ -n "$dir" ]] && { echo "$dir"; return 0; }
  done
  dir="$(ldconfig -p 2>/dev/null | awk '$1 == "libcublas.so.13" {print $NF; exit}')"
  [[ -n "$dir" ]] && { dirname "$dir"; return 0; }
  for dir in /usr/local/cuda*/lib64 /usr/local/cuda*/targets/x86_64-linux/lib; do
    [[ -e "$dir/libcublas.so.13" ]] && { echo "$dir"; return 0; }
  done
  return 1
}

# One line of the summary for a finished binary: its status and its test counts.
summarize() {
  local name="$1" rc="$2" secs="$3" log="$4" status passed failed skipped
  passed="$(grep -Eo '^\[  PASSED  \] [0-9]+' "$log" | grep -Eo '[0-9]+$')"
  failed="$(grep -Eo '^\[  FAILED  \] [0-9]+ test' "$log" | grep -Eo '[0-9]+')"
  skipped="$(grep -Eo '^\[  SKIPPED \] [0-9]+' "$log" | grep -Eo '[0-9]+$')"
  case $rc in
    0) status=ok ;;
    124) status=TIMEOUT ;;
    *) status="FAILED($rc)" ;;
  esac
  # A skipped CUDA test is a failure here (AMPGRAD_REQUIRE_CUDA=1 already makes it fail; this
  # catches a binary that skips by other means).
  [[ "$status" == ok && -n "$skipped" && "$skipped" != 0 ]] && status="FAILED(skips)"
  local tests=""
  [[ -n "$passed$failed$skipped" ]] && tests="passed ${passed:-0}, failed ${failed:-0}, skipped ${skipped:-0}"
  grep -q '^checks: ' "$log" && tests="$(grep -m1 '^checks: ' "$log")"
  printf '%-30s %-14s %5ss  %s\n' "$name" "$status" "$secs" "$tests"
  [[ "$status" == ok ]]
}

run() {
  local bindir logs lib
  if [[ -d "$here/bin" ]]; then bindir="$here/bin"; else bindir="$here/../.gpu_build/bin"; fi
  [[ -d "$bindir" ]] || { echo "no binaries in $bindir; run 'tools/gpu_check.sh build' first" >&2; exit 1; }
  bindir="$(cd "$bindir" && pwd)"
  logs="${GPU_CHECK_LOGS:-$bindir/../logs}"
  mkdir -p "$logs" && logs="$(cd "$logs" && pwd)"
  [[ -f "$bindir/../BUILD_INFO" ]] && cat "$bindir/../BUILD_INFO"
  echo "this machine: $(ldd --version 2>&1 | head -n 1)"

  # Before any GPU time: every binary must load here (a missing library or too old a glibc shows as
  # "not found"). cuBLAS is not among them: it is loaded at run time.
  local deps
  deps="$(ldd "$bindir"/* 2>&1)"
  if grep -q 'not found' <<<"$deps"; then
    echo "$deps"
    echo "GPU check FAILED before running anything: the binaries do not load on this machine" >&2
    exit 1
  fi

  if lib="$(find_cublas)"; then
    export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "cuBLAS: $lib"
  else
    echo "warning: no libcublas.so.13 found (Python wheels, ldconfig, /usr/local/cuda*); GEMMs will fail" >&2
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not found"
  export AMPGRAD_REQUIRE_CUDA=1

  # A GPU that ampgrad cannot use (no driver, one older than CUDA 13's, a hidden device) fails the
  # whole check at once, with CUDA's reason, instead of failing every test.
  if [[ -x "$bindir/cuda_test" ]] &&
     ! "$bindir/cuda_test" --gtest_filter=CudaTest.RequiredGpuIsPresent >"$logs/preflight.log" 2>&1; then
    grep -m1 '^cuda_is_available' "$logs/preflight.log" || cat "$logs/preflight.log"
    echo "GPU check: FAILED (no usable GPU; nothing else was run)"
    exit 1
  fi

  # Tests first (each also under AMPGRAD_CUDA_SYNC=1: a kernel fault then names its kernel), then
  # the benchmark.
  local runs=() rows=() failed=0 name
  for name in cuda_test cuda_kernels_test cuda_bench; do
    [[ -x "$bindir/$name" ]] || continue
    runs+=("$name|$bindir/$name|0")
    [[ "$name" == *_test ]] && runs+=("$name SYNC=1|$bindir/$name|1")
  done
  for entry in "${runs[@]}"; do
    local bin sync log start rc secs
    IFS='|' read -r name bin sync <<<"$entry"
    log="$logs/${name// /_}.log"
    start=$(date +%s)
    AMPGRAD_CUDA_SYNC="$sync" timeout "${GPU_CHECK_TIMEOUT:-240}" "$bin" >"$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    echo "==== $name (exit $rc, ${secs}s; log $log)"
    if [[ "$name" == cuda_bench ]]; then
      cat "$log"
    else
      grep -E -A3 'Failure$|^unknown file: Failure' "$log" | head -n 30
      grep -E '^\[  (FAILED|SKIPPED) \] ' "$log" | grep -v ' ms)$' | head -n 20
    fi
    rows+=("$(summarize "$name" "$rc" "$secs" "$log")") || failed=1
  done
  echo
  echo "==== GPU check summary ===="
  printf '%-30s %-14s %6s  %s\n' binary status time tests
  printf '%s\n' "${rows[@]}"
  echo "GPU check: $([[ $failed == 0 ]] && echo PASSED || echo FAILED)"
  exit $failed
}

case "$mode" in
  build) build ;;
  run) run ;;
  *) echo "usage: $0 build|run" >&2; exit 2 ;;
esac
