#!/usr/bin/env bash
# ampgrad vs PyTorch (CPU), side by side: each round runs every workload in ampgrad, then in
# PyTorch, so machine drift hits both; prints the median over rounds and the ratio ampgrad / PyTorch.
# Optional (not part of CI).
#
# Usage: bench/compare_pytorch.sh [--python=PATH] [--make-venv] [--isa=LEVEL] [--cpu-time]
#                                 [rounds (5)] [seconds per run (2)] [threads (2)]
#   The PyTorch interpreter is the first of: --python=PATH; $AMPGRAD_BENCH_PYTHON; .venv-bench/bin/python
#   (a virtual environment with PyTorch 2.x from the Python package index, which --make-venv creates:
#   python3 -m venv .venv-bench && .venv-bench/bin/pip install torch); /usr/bin/python3 with Debian's
#   python3-torch (1.13, OpenBLAS: apt-get install python3-torch libopenblas0-openmp). It says which ran.
#   --isa=avx2 limits both sides to AVX2 (AMPGRAD_CPU_ISA, and PyTorch's ATEN_CPU_CAPABILITY,
#   MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA), to stand in for an AVX2-only CPU; --isa=baseline
#   and --isa=avx512 set AMPGRAD_CPU_ISA alone.
#   --cpu-time (1 thread only) times both sides with their process's CPU clock: on a shared, busy
#   machine the time a process waits for a core is then left out of both.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-bench
python=${AMPGRAD_BENCH_PYTHON:-}
make_venv=0
isa=
cpu_time=
positional=()
for arg in "$@"; do
  case $arg in
    --python=*) python=${arg#--python=} ;;
    --make-venv) make_venv=1 ;;
    --isa=*) isa=${arg#--isa=} ;;
    --cpu-time) cpu_time=--cpu-time ;;
    -h | --help) sed -n '2,16p' "$0"; exit 0 ;;
    *) positional+=("$arg") ;;
  esac
done
rounds=${positional[0]:-5}
seconds=${positional[1]:-2}
threads=${positional[2]:-2}
if [[ -n $cpu_time && $threads != 1 ]]; then
  echo "compare_pytorch: --cpu-time needs 1 thread (the last argument)" >&2
  exit 2
fi

if ((make_venv)) && [[ ! -x $venv/bin/python ]]; then
  echo "compare_pytorch: creating $venv with PyTorch from the Python package index (a few GB)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install torch >&2
fi
if [[ -z $python ]]; then
  if [[ -x $venv/bin/python ]]; then python=$venv/bin/python; else python=/usr/bin/python3; fi
fi
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "compare_pytorch: $python cannot import torch; run with --make-venv (PyTorch 2.x), pass --python=PATH," \
    "or install Debian's python3-torch and libopenblas0-openmp" >&2
  exit 1
fi
if [[ -n $isa ]]; then
  export AMPGRAD_CPU_ISA=$isa
  if [[ $isa == avx2 ]]; then
    export ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
  fi
fi

./bazelw build //bench:step_timer //bench:fma_peak >&2
bin=$(mktemp -d)
cp bazel-bin/bench/step_timer bazel-bin/bench/fma_peak "$bin/"  # private copies: a concurrent build cannot swap them mid-run
timer=$bin/step_timer

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p') ($(grep -o -w -E 'avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512dq|avx512_bf16|avx512_fp16|amx_tile|amx_bf16|amx_fp16' /proc/cpuinfo | sort -u | tr '\n' ' '| sed 's/ $//'))"
echo "PyTorch: $("$python" bench/pytorch_workloads.py --version) from $python"
echo "threads: $threads${cpu_time:+ (CPU time)}; load average $(cut -d' ' -f1-3 /proc/loadavg); AMPGRAD_CPU_ISA=${AMPGRAD_CPU_ISA:-(unset: native)}${ATEN_CPU_CAPABILITY:+; PyTorch limited to $ATEN_CPU_CAPABILITY}"

# name | ampgrad workload | PyTorch workload (bf16 = PyTorch's CPU autocast, its CPU AMP)
pairs=(
  "seed FP32|seed_fp32|seed_fp32"
  "seed AMP (PyTorch: autocast bf16)|seed_amp|seed_bf16"
  "mlp SGD FP32|mlp_sgd_fp32|mlp_sgd_fp32"
  "mlp Adam FP32|mlp_adam_fp32|mlp_adam_fp32"
  "mlp Adam AMP (PyTorch: autocast bf16)|mlp_adam_amp|mlp_adam_bf16"
  "mlp Adam BF16 autocast|mlp_adam_bf16|mlp_adam_bf16"
  "fashion MLP FP32|fashion_fp32|fashion_fp32"
  "fashion MLP AMP (PyTorch: fp16 + GradScaler)|fashion_amp|fashion_fp16"
  "char_gpt FP32|gpt_fp32|gpt_fp32"
  "char_gpt AMP (PyTorch: fp16 + GradScaler)|gpt_amp|gpt_fp16"
  "add [64,512,768]+[768] FP32|add_bias_fp32|add_bias_fp32"
  "add [64,512,768]+[768] FP16|add_bias_fp16|add_bias_fp16"
  "add residual [64,512,768] FP32|add_residual_fp32|add_residual_fp32"
  "add residual [64,512,768] FP16|add_residual_fp16|add_residual_fp16"
  "bmm [8,12,256,64]@[..,64,256] FP32|bmm_fp32|bmm_fp32"
  "bmm [8,12,256,64]@[..,64,256] FP16|bmm_fp16|bmm_fp16"
  "fashion CNN FP32|fashion_cnn_fp32|fashion_cnn_fp32"
  "fashion CNN BF16 autocast|fashion_cnn_bf16|fashion_cnn_bf16"
  "conv2d fwd+bwd CNN [128,32,14,14] FP32|conv_cnn_fp32|conv_cnn_fp32"
  "conv2d fwd+bwd CNN [128,32,14,14] BF16|conv_cnn_bf16|conv_cnn_bf16"
  "conv2d fwd+bwd ResNet [32,64,56,56] FP32|conv_resnet_fp32|conv_resnet_fp32"
  "conv2d fwd+bwd ResNet [32,64,56,56] BF16|conv_resnet_bf16|conv_resnet_bf16"
)
results=$(mktemp)
for ((round = 1; round <= rounds; ++round)); do
  echo "round $round/$rounds" >&2
  "$timer" copy_bandwidth --seconds="$seconds" --threads="$threads" $cpu_time | awk '{print "copy|" $3}' >>"$results"
  for pair in "${pairs[@]}"; do
    IFS='|' read -r name ours theirs <<<"$pair"
    # (Each command finishes before the next starts: read from a finished $(...), not a pipe.)
    out=$("$timer" "$ours" --seconds="$seconds" --threads="$threads" $cpu_time)
    read -r _ a a_rate <<<"$out"
    # PyTorch's bf16 mlp step and FP16 bmm take ~1 s or more here: one short run per round is enough.
    s=$seconds; [[ $theirs == mlp_*_bf16 || $theirs == bmm_fp16 ]] && s=0.5
    out=$("$python" bench/pytorch_workloads.py "$theirs" --seconds="$s" --threads="$threads" $cpu_time)
    read -r _ b b_rate <<<"$out"
    echo "$name|$a|$b|${a_rate:-}|${b_rate:-}" >>"$results"
  done
done

"$python" - "$results" "$threads" "${pairs[@]}" <<'PY'
import statistics, sys
rows, copy = {}, []
for line in open(sys.argv[1]):
    fields = line.rstrip("\n").split("|")
    if fields[0] == "copy":
        copy.append(float(fields[1]))
        continue
    name, a, b, ra, rb = fields
    rows.setdefault(name, []).append((float(a), float(b), float(ra) if ra else None, float(rb) if rb else None))
copy_bw = statistics.median(copy)
print(f"{'workload (' + sys.argv[2] + ' threads)':40} {'ampgrad us':>12} {'PyTorch us':>12} {'ratio':>7} "
      f"{'ratio min..max':>16}   {'ampgrad':>9} {'PyTorch':>9}")
for pair in sys.argv[3:]:
    name = pair.split("|")[0]
    runs = rows[name]
    ratios = [a / b for a, b, _, _ in runs]
    line = (f"{name:40} {statistics.median(a for a, *_ in runs):12.1f} {statistics.median(b for _, b, *_ in runs):12.1f} "
            f"{statistics.median(ratios):7.3f} {min(ratios):7.3f}..{max(ratios):<7.3f}")
    if runs[0][2] is not None:
        unit = "GFLOP/s" if "bmm" in name or "conv2d" in name else "GB/s"
        ra, rb = statistics.median(r[2] for r in runs), statistics.median(r[3] for r in runs)
        line += f"   {ra:9.2f} {rb:9.2f} {unit}"
        if unit == "GB/s":
            line += f" ({ra / copy_bw:.2f} / {rb / copy_bw:.2f} of copy)"
    print(line)
print(f"copy bandwidth (96 MiB float copy on {sys.argv[2]} threads, read + written): {copy_bw:.2f} GB/s")
print(f"(median over {len(next(iter(rows.values())))} interleaved rounds; ratio = ampgrad / PyTorch, per round)")
PY

# ampgrad's own AMP / FP32 ratios: both workloads in one process, alternating 10 ms chunks, so
# the machine's drift cancels (prints: us FP32, us AMP, median ratio, min, max).
"$timer" ratio seed_fp32 seed_amp --seconds="$(awk "BEGIN { print $rounds * $seconds }")" --threads="$threads" $cpu_time
"$timer" ratio mlp_sgd_fp32 mlp_sgd_amp --seconds="$(awk "BEGIN { print $rounds * $seconds }")" --threads="$threads" $cpu_time
"$timer" ratio mlp_adam_fp32 mlp_adam_amp --seconds="$(awk "BEGIN { print $rounds * $seconds }")" --threads="$threads" $cpu_time
"$timer" ratio mlp_adam_fp32 mlp_adam_bf16 --seconds="$(awk "BEGIN { print $rounds * $seconds }")" --threads="$threads" $cpu_time
"$timer" ratio fashion_fp32 fashion_amp --seconds="$(awk "BEGIN { print $rounds * $seconds }")" --threads="$threads" $cpu_time
"$timer" ratio gpt_fp32 gpt_amp --seconds="$(awk "BEGIN { print $rounds * $seconds }")" --threads="$threads" $cpu_time

# GEMM speed (linear forward, 1024^3, median of 5 chunks) against the measured FMA peak, and memory.
for w in gemm1024_fp32 gemm1024_fp16 gemm1024_bf16; do echo "$("$timer" "$w" --seconds="$seconds" --threads="$threads" $cpu_time) GFLOP/s ($threads threads)"; done
"$timer" gemm1024_fp32 --seconds="$seconds" --threads=1 --cpu-time | sed 's/$/ GFLOP\/s (1 thread, CPU time)/'
"$bin/fma_peak" --seconds=0.5 | tac | awk '!seen[$2]++' | tac  # the last round's line per unit
"$timer" memory_seed
"$timer" memory_mlp_fp32
"$timer" memory_mlp_fp16params
"$timer" memory_fashion_amp
"$timer" memory_gpt_amp
