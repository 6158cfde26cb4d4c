#!/usr/bin/env bash
# GPU check in two halves, for GPU machines that have no Bazel.
#   tools/gpu_check.sh build   (here, with the CUDA toolkit): builds the CUDA test and benchmark
#                              binaries with ampgrad, libstdc++, zlib and the CUDA runtime linked in
#                              statically; they need only glibc (>= the floor printed and stored in
#                              BUILD_INFO), libgcc_s, and at run time the driver, libcublas.so.13
#                              and libcublasLt.so.13 (loaded with dlopen). nccl_test also needs MPI and libnccl.so.2:
#                              this machine's MPI runtime (libraries, components, help text) is
#                              packed beside it in mpi-runtime.tar.gz, NCCL is the GPU machine's.
#                              Also builds examples/char_gpt and copies a text for it to train on
#                              (the fortunes texts, else the project's Markdown) into data/.
#                              Copies them and this script into the git-ignored .gpu_build/
#                              (about 45 MB; ship that folder).
#   tools/gpu_check.sh run     (on the GPU machine, from .gpu_build/ or the repo root): checks with
#                              ldd that every binary loads, finds libcublas.so.13 and
#                              libcublasLt.so.13 (Python's CUDA 13
#                              wheels, then ldconfig, then /usr/local/cuda*; never a walk of /), runs
#                              every binary with AMPGRAD_REQUIRE_CUDA=1 (a skipped CUDA test is a
#                              failure), a test that failed once more with AMPGRAD_CUDA_SYNC=1 (every
#                              test with GPU_CHECK_SYNC=always), keeps the
#                              logs and prints a summary table last. Exit status 0 only if all pass.
#                              Between the tests and the benchmark, char_gpt trains 300 steps on
#                              the GPU in FP32, FP16 AMP and BF16 AMP; a run whose validation loss
#                              is not finite and below the unigram model's fails.
#                              Last, where python3 has CUDA torch, the PyTorch peer of
#                              cuda_bench's GPT-2 row (peer/pytorch_cuda_workloads.py gpt2: eager
#                              and torch.compile) and conv2d rows (cuDNN), printed beside it; not a check.
#                              nccl_test runs as a single-rank MPI job (an isolated singleton: no
#                              mpirun, no daemon) on the unpacked MPI runtime and libnccl.so.2
#                              (Python's NCCL wheel, then ldconfig, then /usr/local/cuda*).
# Env: GPU_CHECK_TIMEOUT (seconds per binary, default 240), GPU_CHECK_LOGS (log folder, default
# logs/ beside the binaries).
set -uo pipefail

mode="${1:-}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# The CUDA test and benchmark binaries, in the order they run, and the example that trains on the GPU.
targets=(//tests:cuda_test //tests:cuda_kernels_test //tests:gpt_cuda_test //tests:nccl_test //bench:cuda_bench
         //examples:char_gpt)
# The text char_gpt trains on in the bundle (the GPU machine has no fortunes package).
fortunes=/usr/share/games/fortunes

# The newest glibc symbol version the binaries in $1 need: the oldest glibc they run on.
glibc_floor() {
  objdump -T "$1"/* 2>/dev/null | grep -o 'GLIBC_[0-9][0-9.]*' | sort -uV | tail -n 1 | sed 's/GLIBC_//'
}

# Libraries every GPU machine has (glibc's own and libgcc_s): a binary may need them, never shipped.
system_libs='^(libc|libm|libdl|libpthread|librt|libgcc_s|ld-linux-x86-64)\.so\.[0-9]+$'

# The shared libraries binary $1 names itself (its NEEDED entries), one per line.
needed() { objdump -p "$1" | awk '$1 == "NEEDED" {print $2}'; }

# One of ompi_info's install paths (prefix, pkglibdir, pkgdatadir) of the MPI the build linked.
ompi_path() { ompi_info --parsable --path "$1" | awk -F: '{print $NF}'; }

# Packs the MPI runtime nccl_test needs into $1/mpi-runtime.tar.gz, at the paths it was installed
# at (the run relocates it with OPAL_PREFIX and PMIX_INSTALL_PREFIX): libmpi and every library it
# and its components need (not the system's, libstdc++, NCCL or the driver's: the GPU machine has
# its own), the components, the help text; and mpi.env, which names the install prefixes. Java and
# header files stay behind. A subshell, so the staging folder goes on every way out.
pack_mpi_runtime() (
  local out="$1" stage prefix pkglibdir pkgdatadir pmix lib
  command -v ompi_info >/dev/null || { echo "error: ompi_info not found (./bazelw installs OpenMPI)" >&2; exit 1; }
  prefix="$(ompi_path prefix)" pkglibdir="$(ompi_path pkglibdir)" pkgdatadir="$(ompi_path pkgdatadir)"
  if [[ "$prefix" != /* || ! -d "$pkglibdir" || ! -d "$pkgdatadir" || "$pkglibdir" == / ]]; then
    echo "error: ompi_info gave no usable install paths (prefix '$prefix', pkglibdir '$pkglibdir')" >&2
    exit 1
  fi
  pmix="$(ompi_info --all --parsable | grep -o -- "--with-pmix=[^' ]*" | head -n 1 | cut -d= -f2)"
  [[ "$pmix" == /* && -d "$pmix/lib" ]] || pmix=""  # "internal", "external" or none: nothing apart
  stage="$(mktemp -d)" || exit 1
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/lib" "$stage$pkglibdir" "$stage$pkgdatadir" || exit 1
  cp -a "$pkglibdir/." "$stage$pkglibdir/" && cp -a "$pkgdatadir/." "$stage$pkgdatadir/" || exit 1
  rm -f "$stage$pkglibdir"/*java*
  if [[ -n "$pmix" ]]; then  # an external PMIx has its own components
    mkdir -p "$stage$pmix/lib"
    cp -a "$pmix/lib/pmix" "$stage$pmix/lib/" 2>/dev/null
    [[ -d "$pmix/share" ]] && cp -a "$pmix/share" "$stage$pmix/"
  fi
  for lib in $( { ldd "$out/bin/nccl_test"; find "$stage" -name '*.so*' -type f -exec ldd {} \; ; } 2>/dev/null |
                awk '/=>/ && $3 ~ /^\// {print $3}' | sort -u |
                awk -F/ '{print $NF "\t" $0}' | grep -Ev '^(libc|libm|libdl|libpthread|librt|libgcc_s|ld-linux-x86-64|libstdc\+\+|libnccl|libcuda)\.so|^libnvidia-' |
                cut -f2); do
    cp -L "$lib" "$stage/lib/" || exit 1
  done
  printf 'prefix=%s\npmix=%s\n' "$prefix" "$pmix" >"$stage/mpi.env"
  tar -C "$stage" -czf "$out/mpi-runtime.tar.gz" . || exit 1
  echo "MPI runtime: $(ompi_info --version 2>/dev/null | head -n 1), $(du -h "$out/mpi-runtime.tar.gz" | cut -f1) packed"
)

# The text char_gpt trains on in the bundle, $1/char_gpt.txt: the fortunes texts in the order
# char_gpt reads that folder (sorted by name, without fortune's .dat indexes and .u8 links), so a
# run on the GPU sees the text a CPU run sees; without the package, the project's Markdown files.
# $1/SOURCE says which.
copy_text() {
  local dir="$1" root="$2" f
  mkdir -p "$dir"
  if [[ -d "$fortunes" ]]; then
    for f in $(LC_ALL=C ls "$fortunes"); do
      if [[ -f "$fortunes/$f" && ! -L "$fortunes/$f" && "$f" != *.dat && "$f" != *.u8 ]]; then
        cat "$fortunes/$f" || return 1
      fi
    done >"$dir/char_gpt.txt"
    echo "$fortunes (fortunes package)" >"$dir/SOURCE"
  else
    echo "warning: no $fortunes (./bazelw installs the fortunes package); char_gpt gets the project's Markdown" >&2
    (cd "$root" && git ls-files '*.md' | LC_ALL=C sort | xargs cat) >"$dir/char_gpt.txt" || return 1
    echo "the project's Markdown files" >"$dir/SOURCE"
  fi
  echo "char_gpt text: $(du -h "$dir/char_gpt.txt" | cut -f1), $(cat "$dir/SOURCE")"
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
  # arc4random keeps static libstdc++ from needing glibc 2.36, and compresses the device code for
  # size (third_party/cuda/cuda.bzl).
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
  # The PyTorch peer of cuda_bench, run where the GPU machine has torch.
  mkdir -p "$out/peer" && cp -f bench/pytorch_cuda_workloads.py examples/gpt_pytorch.py "$out/peer/" || exit 1
  copy_text "$out/data" "$root" || { echo "error: could not write $out/data/char_gpt.txt" >&2; exit 1; }
  local floor
  floor="$(glibc_floor "$out/bin")"
  {
    echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
    echo "built $(date -u +%Y-%m-%dT%H:%MZ) on $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), $(ldd --version | head -n 1)"
    echo "glibc floor $floor"
    echo "char_gpt text: $(cat "$out/data/SOURCE")"
  } >"$out/BUILD_INFO"
  echo "shared libraries the binaries need:"
  ldd "$out"/bin/* | awk '/=>/ {print "  " $1}' | sort -u
  # Only glibc's own libraries and libgcc_s may stay shared (libstdc++ and zlib are linked in);
  # nccl_test may also name MPI (packed below) and NCCL (the GPU machine's).
  local bin extra=""
  for bin in "$out"/bin/*; do
    extra+="$(needed "$bin" | grep -Ev "$system_libs" |
              { if [[ "$bin" == */nccl_test ]]; then grep -Ev '^(libmpi\.so\.[0-9]+|libnccl\.so\.2)$'; else cat; fi } |
              sed "s|^| $(basename "$bin"): |")"
  done
  if [[ -n "$extra" ]]; then
    echo "error: the bundle needs shared libraries a GPU machine may lack:$extra" >&2
    exit 1
  fi
  pack_mpi_runtime "$out" || exit 1
  cat "$out/BUILD_INFO"
  du -sh "$out"
  echo "ship $out to the GPU machine and run: bash gpu_check.sh run"
}

# Prints the folder holding library $1 (libcublas.so.13, libnccl.so.2), looking only where it is
# installed: the CUDA Python wheels of the python on PATH (site-packages/nvidia/ then $2, a
# space-separated list of subfolders), the dynamic linker's cache, then the toolkits under
# /usr/local.
find_cuda_lib() {
  local name="$1" subdirs="$2" py dir
  for py in python3 python; do
    command -v "$py" >/dev/null 2>&1 || continue
    dir="$(timeout 30 "$py" - "$name" $subdirs <<'EOF' 2>/dev/null
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
    for sub in sys.argv[2:]:
        if glob.glob(os.path.join(root, "nvidia", sub, sys.argv[1] + "*")):
            print(os.path.join(root, "nvidia", sub))
            sys.exit(0)
EOF
)"
    [[ -n "$dir" ]] && { echo "$dir"; return 0; }
  done
  dir="$(ldconfig -p 2>/dev/null | awk -v name="$name" '$1 == name {print $NF; exit}')"
  [[ -n "$dir" ]] && { dirname "$dir"; return 0; }
  for dir in /usr/local/cuda*/lib64 /usr/local/cuda*/targets/x86_64-linux/lib; do
    [[ -e "$dir/$name" ]] && { echo "$dir"; return 0; }
  done
  return 1
}

# A finished run's status from its exit status $1: ok, TIMEOUT or FAILED(status).
exit_status() {
  case $1 in
    0) echo ok ;;
    124) echo TIMEOUT ;;
    *) echo "FAILED($1)" ;;
  esac
}

# One line of the summary for a finished binary: its status and its test counts.
summarize() {
  local name="$1" rc="$2" secs="$3" log="$4" status passed failed skipped
  passed="$(grep -Eo '^\[  PASSED  \] [0-9]+' "$log" | grep -Eo '[0-9]+$')"
  failed="$(grep -Eo '^\[  FAILED  \] [0-9]+ test' "$log" | grep -Eo '[0-9]+')"
  skipped="$(grep -Eo '^\[  SKIPPED \] [0-9]+' "$log" | grep -Eo '[0-9]+$')"
  status="$(exit_status "$rc")"
  # A skipped CUDA test is a failure here (AMPGRAD_REQUIRE_CUDA=1 already makes it fail; this
  # catches a binary that skips by other means).
  [[ "$status" == ok && -n "$skipped" && "$skipped" != 0 ]] && status="FAILED(skips)"
  local tests=""
  [[ -n "$passed$failed$skipped" ]] && tests="passed ${passed:-0}, failed ${failed:-0}, skipped ${skipped:-0}"
  grep -q '^checks: ' "$log" && tests="$(grep -m1 '^checks: ' "$log")"
  printf '%-30s %-14s %5ss  %s\n' "$name" "$status" "$secs" "$tests"
  [[ "$status" == ok ]]
}

# One line of the summary for a char_gpt training: ok when it ran, and its validation loss is
# finite and below the unigram model's (a run that diverged, or learnt nothing, fails).
summarize_training() {
  local name="$1" rc="$2" secs="$3" log="$4" status line val unigram number='^[0-9]+(\.[0-9]+)?$'
  line="$(grep -m1 '^validation loss ' "$log")"
  val="$(sed -n 's/^validation loss \([^ ]*\) after.*/\1/p' <<<"$line")"
  unigram="$(sed -n 's/.*(unigram model: \([^)]*\)).*/\1/p' <<<"$line")"
  status="$(exit_status "$rc")"
  # printf prints a diverged loss as nan or inf, which the pattern refuses.
  if [[ "$status" == ok ]] && ! { [[ "$val" =~ $number && "$unigram" =~ $number ]] &&
                                  awk -v v="$val" -v u="$unigram" 'BEGIN { exit !(v + 0 < u + 0) }'; }; then
    status="FAILED(loss)"
  fi
  local what="no validation loss"
  if [[ -n "$line" ]]; then
    what="val $val (unigram $unigram)$(sed -n 's/.*), \([0-9]*\) steps skipped, final scale \([^ ]*\)$/, \1 skipped, scale \2/p' <<<"$line")"
    what+="$(sed -n 's/^trained in \([^ ]*\) s (\([^ ]*\) ms per step.*/, \1 s, \2 ms\/step/p' "$log")"
  fi
  printf '%-30s %-14s %5ss  %s\n' "$name" "$status" "$secs" "$what"
  [[ "$status" == ok ]]
}

# Unpacks the MPI runtime $1 (see pack_mpi_runtime) into folder $2 and prints the VAR=value lines nccl_test runs
# with: one rank as an isolated singleton (no mpirun, no daemon), the runtime relocated to where it
# was unpacked, and NCCL found like cuBLAS. Says on stderr what it could not find.
mpi_runtime_env() {
  local tarball="$1" dir="$2" nccl prefix pmix
  [[ -f "$tarball" ]] || { echo "warning: no $tarball; nccl_test will fail to load" >&2; return 1; }
  tar -C "$dir" -xzf "$tarball" || return 1
  prefix="$(sed -n 's/^prefix=//p' "$dir/mpi.env")" pmix="$(sed -n 's/^pmix=//p' "$dir/mpi.env")"
  if nccl="$(find_cuda_lib libnccl.so.2 "nccl/lib cu13/lib")"; then
    echo "NCCL: $nccl" >&2
  else
    echo "warning: no libnccl.so.2 found (Python wheels, ldconfig, /usr/local/cuda*)" >&2
  fi
  echo "LD_LIBRARY_PATH=$dir/lib${nccl:+:$nccl}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "OPAL_PREFIX=$dir$prefix"
  [[ -n "$pmix" ]] && echo "PMIX_INSTALL_PREFIX=$dir$pmix"
  echo "OMPI_MCA_ess_singleton_isolated=1"
  echo "OMPI_MCA_btl=self"
  echo "OMPI_MCA_pml=ob1"  # no UCX, OFI or PSM2 start-up for a single rank
  # Components for network hardware this machine lacks fail to load; that is expected.
  echo "OMPI_MCA_mca_base_component_show_load_errors=0"
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
  # "not found"). cuBLAS is not among them: it is loaded at run time. nccl_test is checked below,
  # with its MPI runtime.
  local deps
  deps="$(find "$bindir" -maxdepth 1 -type f ! -name nccl_test -exec ldd {} + 2>&1)"
  if grep -q 'not found' <<<"$deps"; then
    echo "$deps"
    echo "GPU check FAILED before running anything: the binaries do not load on this machine" >&2
    exit 1
  fi

  if lib="$(find_cuda_lib libcublas.so.13 "cu13/lib cublas/lib")"; then
    export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "cuBLAS: $lib"
  else
    echo "warning: no libcublas.so.13 found (Python wheels, ldconfig, /usr/local/cuda*); GEMMs will fail" >&2
  fi
  # cuBLASLt (the FP8 GEMMs) sits beside cuBLAS in the wheels and toolkits; look for it on its own
  # in case an install splits them.
  local lt_lib
  if lt_lib="$(find_cuda_lib libcublasLt.so.13 "cu13/lib cublas/lib")"; then
    [[ "$lt_lib" == "$lib" ]] || export LD_LIBRARY_PATH="$lt_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "cuBLASLt: $lt_lib"
  else
    echo "warning: no libcublasLt.so.13 found (Python wheels, ldconfig, /usr/local/cuda*); FP8 GEMMs will fail" >&2
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

  # nccl_test's environment: the MPI runtime unpacked, and this machine's NCCL. Without them it
  # still runs, and fails with the reason.
  local nccl_env=()
  if [[ -x "$bindir/nccl_test" ]]; then
    mpi_dir="$(mktemp -d "${TMPDIR:-/tmp}/ampgrad-mpi.XXXXXX")" || exit 1
    trap 'rm -rf "$mpi_dir"' EXIT
    mapfile -t nccl_env < <(mpi_runtime_env "$bindir/../mpi-runtime.tar.gz" "$mpi_dir")
    if ! env ${nccl_env[@]+"${nccl_env[@]}"} ldd "$bindir/nccl_test" >"$logs/nccl_test_ldd.log" 2>&1 ||
       grep -q 'not found' "$logs/nccl_test_ldd.log"; then
      echo "nccl_test does not load here:"; grep 'not found' "$logs/nccl_test_ldd.log"
    fi
  fi

  # Tests first (a failed one again under AMPGRAD_CUDA_SYNC=1: a kernel fault then names its kernel), then
  # char_gpt's trainings (FP32, FP16 AMP, BF16 AMP), then the benchmark.
  local runs=() rows=() failed=0 name text="$bindir/../data/char_gpt.txt"
  for name in cuda_test cuda_kernels_test gpt_cuda_test nccl_test char_gpt cuda_bench; do
    [[ -x "$bindir/$name" ]] || continue
    if [[ "$name" == char_gpt ]]; then
      runs+=("char_gpt fp32|$bindir/$name|0|" "char_gpt fp16 amp|$bindir/$name|0|--amp=fp16"
             "char_gpt bf16 amp|$bindir/$name|0|--amp=bf16")
      continue
    fi
    runs+=("$name|$bindir/$name|0|")
    [[ "$name" == *_test ]] && runs+=("$name SYNC=1|$bindir/$name|1|")
  done
  local last_rc=0
  for entry in "${runs[@]}"; do
    local bin sync amp log start rc secs extra_env=() args=()
    IFS='|' read -r name bin sync amp <<<"$entry"
    # The synchronous rerun only where the test failed (it names the kernel that faulted); set
    # GPU_CHECK_SYNC=always to rerun every test.
    [[ "$sync" == 1 && "$last_rc" == 0 && "${GPU_CHECK_SYNC:-}" != always ]] && continue
    [[ "$name" == nccl_test* ]] && extra_env=(${nccl_env[@]+"${nccl_env[@]}"})
    [[ "$name" == char_gpt* ]] &&
      args=(--device=cuda --data="$text" --steps=300 --eval-every=100 --sample=120 ${amp:+"$amp"})
    log="$logs/$(tr ' =' '__' <<<"$name").log"
    start=$(date +%s)
    env ${extra_env[@]+"${extra_env[@]}"} AMPGRAD_CUDA_SYNC="$sync" timeout "${GPU_CHECK_TIMEOUT:-240}" "$bin" \
      ${args[@]+"${args[@]}"} >"$log" 2>&1
    rc=$?
    last_rc=$rc
    secs=$(( $(date +%s) - start ))
    echo "==== $name (exit $rc, ${secs}s; log $log)"
    if [[ "$name" == cuda_bench || "$name" == char_gpt* ]]; then
      cat "$log"
    else
      grep -E -A3 'Failure$|^unknown file: Failure' "$log" | head -n 30
      grep -E '^\[  (FAILED|SKIPPED) \] ' "$log" | grep -v ' ms)$' | head -n 20
    fi
    if [[ "$name" == char_gpt* ]]; then
      rows+=("$(summarize_training "$name" "$rc" "$secs" "$log")") || failed=1
    else
      rows+=("$(summarize "$name" "$rc" "$secs" "$log")") || failed=1
    fi
  done
  # The peer: PyTorch's eager and compiled GPT-2 step, where this machine's python has CUDA torch.
  # Not a check (its result does not change the status), a measurement beside cuda_bench's.
  local peer="$bindir/../peer/pytorch_cuda_workloads.py"
  [[ -f "$peer" ]] || peer="$here/../bench/pytorch_cuda_workloads.py"
  if [[ -f "$peer" ]] && timeout 60 python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    echo "==== PyTorch peer: $peer gpt2 conv (log $logs/pytorch_gpt2.log)"
    timeout "${GPU_CHECK_TIMEOUT:-240}" python3 "$peer" gpt2 conv >"$logs/pytorch_gpt2.log" 2>&1
    echo "(exit $?)"
    cat "$logs/pytorch_gpt2.log"
  else
    echo "==== PyTorch peer: skipped (no python3 with CUDA torch here)"
  fi
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
