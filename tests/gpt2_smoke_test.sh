#!/usr/bin/env bash
# GPT-2 small's shape end to end on the CPU: char_gpt --preset=gpt2-124m with the vocabulary padded
# to 50304 and activation checkpointing, 2 steps at a short context, in FP32, BF16 autocast and FP16
# AMP (autocast with GradScaler).
# It must train (a finite loss), report tokens/s and the allocator's peak, and count GPT-2 small's
# parameters at that shape: 123,714,048 (50304 x 768 tied embeddings, 32 positions, 12 blocks of
# 7,087,872, the final norm); --block after the preset shortens the context it set.
# Usage: gpt2_smoke_test.sh CHAR_GPT
set -euo pipefail
char_gpt=$1
text=${TEST_TMPDIR:-/tmp}/gpt2_smoke.txt
for i in $(seq 200); do echo "the quick brown fox jumps over the lazy dog, $i times."; done >"$text"
for amp in "" --amp=bf16 --amp=fp16; do
  out=$("$char_gpt" --data="$text" --preset=gpt2-124m --block=32 --vocab=50304 --batch=1 --steps=2 \
    --eval-every=2 --sample=0 --checkpoint-activations $amp 2>&1)
  echo "$out" | tail -n 4
  grep -q "tok/s" <<<"$out" || { echo "FAIL: no tokens/s on the progress line"; exit 1; }
  grep -q "peak_MiB" <<<"$out" || { echo "FAIL: no peak memory on the progress line"; exit 1; }
  params=$(sed -n 's/^model: \([0-9]*\) parameters$/\1/p' <<<"$out")
  [[ $params == 123714048 ]] || { echo "FAIL: $params parameters, expected 123714048"; exit 1; }
  loss=$(sed -n 's/^validation loss \([0-9.a-z]*\) .*/\1/p' <<<"$out")
  [[ $loss =~ ^[0-9]+\.[0-9]+$ ]] || { echo "FAIL: validation loss '$loss' is not finite"; exit 1; }
done
echo "gpt2 smoke ok"
