#!/usr/bin/env bash
# ampgrad vs PyTorch (CPU), side by side: each round runs every workload in ampgrad, then in
# PyTorch, so machine drift hits both; prints the median over rounds and the ratio ampgrad / PyTorch.
# Optional (not part of CI). Needs Debian's python3-torch and libopenblas0-openmp:
#   sudo apt-get install -y python3-torch libopenblas0-openmp
# Usage: bench/compare_pytorch.sh [rounds (default 5)] [seconds per run (default 2)] [threads (default 2)]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
seconds=${2:-2}
threads=${3:-2}
python=/usr/bin/python3

if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "compare_pytorch: PyTorch is not installed for $python; install python3-torch and libopenblas0-openmp" >&2
  exit 1
fi
./bazelw build //bench:step_timer >&2
timer=$(mktemp -d)/step_timer
cp bazel-bin/bench/step_timer "$timer"  # a private copy: a concurrent build cannot swap it mid-run

# name | ampgrad workload | PyTorch workload (bf16 = PyTorch's CPU autocast, its CPU AMP)
pairs=(
  "seed FP32|seed_fp32|seed_fp32"
  "seed AMP (PyTorch: autocast bf16)|seed_amp|seed_bf16"
  "mlp SGD FP32|mlp_sgd_fp32|mlp_sgd_fp32"
  "mlp Adam FP32|mlp_adam_fp32|mlp_adam_fp32"
  "mlp Adam AMP (PyTorch: autocast bf16)|mlp_adam_amp|mlp_adam_bf16"
  "fashion MLP FP32|fashion_fp32|fashion_fp32"
  "fashion MLP AMP (PyTorch: fp16 + GradScaler)|fashion_amp|fashion_fp16"
)
results=$(mktemp)
for ((round = 1; round <= rounds; ++round)); do
  echo "round $round/$rounds" >&2
  for pair in "${pairs[@]}"; do
    IFS='|' read -r name ours theirs <<<"$pair"
    a=$("$timer" "$ours" --seconds="$seconds" --threads="$threads" | awk '{print $2}')
    # PyTorch's bf16 mlp step takes ~1 s or more: one short run per round is enough.
    s=$seconds; [[ $theirs == mlp_*_bf16 ]] && s=0.5
    b=$("$python" bench/pytorch_workloads.py "$theirs" --seconds="$s" --threads="$threads" | awk '{print $2}')
    echo "$name|$a|$b" >>"$results"
  done
done

"$python" - "$results" "$threads" "${pairs[@]}" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, a, b = line.rstrip("\n").split("|")
    rows.setdefault(name, []).append((float(a), float(b)))
print(f"{'workload (' + sys.argv[2] + ' threads)':40} {'ampgrad us':>12} {'PyTorch us':>12} {'ratio':>7} {'ratio min..max':>16}")
for pair in sys.argv[3:]:
    name = pair.split("|")[0]
    runs = rows[name]
    ratios = [a / b for a, b in runs]
    print(f"{name:40} {statistics.median(a for a, _ in runs):12.1f} {statistics.median(b for _, b in runs):12.1f} "
          f"{statistics.median(ratios):7.3f} {min(ratios):7.3f}..{max(ratios):<7.3f}")
print(f"(median over {len(next(iter(rows.values())))} interleaved rounds; ratio = ampgrad / PyTorch, per round)")
PY

# ampgrad's own AMP / FP32 ratios: both workloads in one process, alternating 10 ms chunks, so
# the machine's drift cancels (prints: us FP32, us AMP, median ratio, min, max).
"$timer" ratio seed_fp32 seed_amp --seconds="$(awk "BEGIN { print $rounds * $seconds }")" --threads="$threads"
"$timer" ratio mlp_adam_fp32 mlp_adam_amp --seconds="$(awk "BEGIN { print $rounds * $seconds }")" --threads="$threads"
"$timer" ratio fashion_fp32 fashion_amp --seconds="$(awk "BEGIN { print $rounds * $seconds }")" --threads="$threads"

# GEMM speed (linear forward, 1024^3, median of 5 chunks) and memory, ampgrad alone.
for w in gemm1024_fp32 gemm1024_fp16; do echo "$("$timer" "$w" --seconds="$seconds" --threads="$threads") GFLOP/s ($threads threads)"; done
"$timer" gemm1024_fp32 --seconds="$seconds" --threads=1 | sed 's/$/ GFLOP\/s (1 thread)/'
"$timer" memory_seed
"$timer" memory_mlp_fp32
"$timer" memory_mlp_fp16params
"$timer" memory_fashion_amp
