#!/usr/bin/env bash
# The training examples refuse a size that is not positive (and other bad values) before doing
# anything: exit status 2 and a message that names the flag and the value.
# Usage: example_flags_test.sh CHAR_GPT FASHION_MNIST DDP_MLP DDP_FASHION_MNIST
set -uo pipefail
char_gpt=$1 fashion_mnist=$2 ddp_mlp=$3 ddp_fashion_mnist=$4
failures=0

# refuses NEEDLE BINARY ARGS...: the binary exits with 2 and prints NEEDLE, and trains nothing.
refuses() {
  local needle=$1
  shift
  local out rc
  out=$("$@" 2>&1 </dev/null)
  rc=$?
  if (( rc != 2 )) || ! grep -qF -- "$needle" <<<"$out" || grep -qE "^step|epoch 1" <<<"$out"; then
    echo "FAIL: $(basename "$1") ${*:2}: status $rc, expected 2 and \"$needle\":"
    echo "$out" | tail -n 5
    failures=$((failures + 1))
  else
    echo "ok: $(basename "$1") ${*:2}: $(grep -m1 -F -- "$needle" <<<"$out")"
  fi
}

refuses "--batch must be a whole number >= 1, got '0'" "$char_gpt" --batch=0
refuses "--steps must be a whole number >= 1, got '-3'" "$char_gpt" --steps=-3
refuses "--heads must be a whole number >= 1, got 'two'" "$char_gpt" --heads=two
refuses "--embd must be a whole number >= 1, got ''" "$char_gpt" --embd=
refuses "--eval-every must be a whole number >= 1, got '0'" "$char_gpt" --eval-every=0
refuses "--sample must be a whole number >= 0, got '-1'" "$char_gpt" --sample=-1
refuses "--lr must be a finite number > 0, got '0'" "$char_gpt" --lr=0
refuses "--epochs must be a whole number >= 1, got '0'" "$fashion_mnist" --epochs 0
refuses "--batch-size must be a whole number >= 1, got '-8'" "$fashion_mnist" --batch-size=-8
refuses "--train-samples must be a whole number >= 1, got '0'" "$fashion_mnist" --train-samples 0
refuses "--seed must be a whole number >= 0, got '-1'" "$fashion_mnist" --seed -1
refuses "--lr must be a finite number > 0, got 'nan'" "$fashion_mnist" --lr nan
refuses "--master-weights applies to 16-bit parameters: add --amp=bf16-params" "$fashion_mnist" --master-weights=stochastic
refuses "--master-weights applies to 16-bit parameters: add --amp=bf16-params" "$char_gpt" --amp=bf16 --master-weights=none
refuses "--epochs must be a whole number >= 1, got '0'" "$ddp_mlp" --epochs=0
refuses "--accumulate must be a whole number >= 1, got '0'" "$ddp_mlp" --accumulate=0
refuses "--batch-size must be a whole number >= 1, got '0'" "$ddp_fashion_mnist" --batch-size 0

(( failures == 0 )) || { echo "$failures refusal(s) missing"; exit 1; }
echo "all refusals ok"
