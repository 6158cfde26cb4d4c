#!/usr/bin/env bash
# Regenerates the README's charts (docs/images/*.png) with the examples' own --plot: the underflow
# demo, and char_gpt (800 steps, one thread) with FP16 AMP and with BF16 autocast. Needs gnuplot
# and Debian's fortunes texts (./bazelw installs both). Takes a few minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
./bazelw build //examples:underflow_demo //examples:char_gpt
out=docs/images
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"

bazel-bin/examples/underflow_demo --plot "$tmp/underflow" >/dev/null
for chart in loss scale grad_exponents fp8_grad_scale; do cp "$tmp/underflow/$chart.png" "$out/underflow_$chart.png"; done

for precision in fp16 bf16; do
  OMP_NUM_THREADS=1 bazel-bin/examples/char_gpt --amp="$precision" --steps=800 --eval-every=200 \
    --plot="$tmp/gpt_$precision" >/dev/null
done
cp "$tmp/gpt_fp16/loss.png" "$out/char_gpt_fp16_loss.png"
cp "$tmp/gpt_fp16/scale.png" "$out/char_gpt_fp16_scale.png"
cp "$tmp/gpt_bf16/loss.png" "$out/char_gpt_bf16_loss.png"
ls -l "$out"
