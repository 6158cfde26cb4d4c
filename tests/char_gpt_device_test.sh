#!/usr/bin/env bash
# char_gpt's --device flag from the command line: --device=cuda without a usable GPU (or in a
# CPU-only build) stops at once with exit status 1 and a message that names the flag and CUDA's
# reason, never a crash; with a GPU it trains there. A device it does not know is a usage error.
set -uo pipefail

bin="$1"
fail() { echo "FAIL: $*" >&2; exit 1; }

data="${TEST_TMPDIR:-$(mktemp -d)}/text.txt"
for _ in $(seq 100); do echo "the quick brown fox jumps over the lazy dog. pack my box with five dozen jugs."; done >"$data"
common=(--data="$data" --steps=2 --eval-every=1 --batch=2 --block=16 --layers=1 --heads=1 --embd=16 --sample=0)

out="$("$bin" --device=cuda "${common[@]}" 2>&1)"
rc=$?
if (( rc == 0 )); then
  grep -q "FP32 on cuda" <<<"$out" || fail "exit 0 but no training on cuda:"$'\n'"$out"
  echo "ok: a GPU is present; trained on it"
else
  (( rc == 1 )) || fail "--device=cuda without a GPU exited with $rc, not 1:"$'\n'"$out"
  grep -q -- "--device=cuda needs a usable CUDA GPU, and there is none: ." <<<"$out" ||
    fail "the refusal does not name the flag and the reason:"$'\n'"$out"
  grep -q "^step" <<<"$out" && fail "it trained before refusing:"$'\n'"$out"
  echo "ok: $(grep -m1 -- '--device=cuda' <<<"$out")"
fi

out="$("$bin" --device=cpu "${common[@]}" 2>&1)" || fail "--device=cpu failed:"$'\n'"$out"
grep -q "FP32 on cpu" <<<"$out" || fail "--device=cpu did not train on the CPU:"$'\n'"$out"

out="$("$bin" --device=tpu "${common[@]}" 2>&1)"
rc=$?
(( rc == 2 )) || fail "--device=tpu exited with $rc, not 2 (usage):"$'\n'"$out"
grep -q -- "--device=cpu|cuda" <<<"$out" || fail "no usage line for --device=tpu:"$'\n'"$out"
