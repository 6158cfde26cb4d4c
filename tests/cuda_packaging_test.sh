#!/usr/bin/env bash
# Packaging claims of a CUDA build, checked on its test binary (in a CPU-only build they hold
# trivially): it links no CUDA shared library (the runtime is static, cuBLAS is loaded at run
# time), so it starts where the CUDA libraries are absent; and AMPGRAD_REQUIRE_CUDA=1 makes a
# missing GPU a failure that gives the reason, while a present one passes.
set -uo pipefail

bin="$1"
fail() { echo "FAIL: $*" >&2; exit 1; }

deps="$(ldd "$bin" 2>&1)" || fail "ldd $bin failed: $deps"
grep -q "not found" <<<"$deps" && fail "unresolved libraries:"$'\n'"$deps"
grep -Eq "libcublas|libcudart|libcuda\.so" <<<"$deps" && fail "links a CUDA library:"$'\n'"$deps"

# Starts without any CUDA library on the search path.
out="$(env -u LD_LIBRARY_PATH "$bin" --gtest_filter=CudaTest.AvailabilityQueryNeverCrashes 2>&1)" ||
  fail "does not run without LD_LIBRARY_PATH:"$'\n'"$out"

out="$(AMPGRAD_REQUIRE_CUDA=1 "$bin" --gtest_filter=CudaTest.RequiredGpuIsPresent 2>&1)"
rc=$?
line="$(grep -m1 '^cuda_is_available: ' <<<"$out")" || fail "no availability line:"$'\n'"$out"
if [[ "$line" == "cuda_is_available: 1"* ]]; then
  (( rc == 0 )) || fail "a GPU is present but the required run failed:"$'\n'"$out"
else
  (( rc != 0 )) || fail "no GPU, yet AMPGRAD_REQUIRE_CUDA=1 passed:"$'\n'"$out"
  grep -q "AMPGRAD_REQUIRE_CUDA=1 but cuda_is_available() is false: ." <<<"$out" ||
    fail "the failure does not give the reason:"$'\n'"$out"
fi
if out="$(AMPGRAD_REQUIRE_CUDA=yes "$bin" --gtest_filter=CudaTest.RequiredGpuIsPresent 2>&1)"; then
  fail "AMPGRAD_REQUIRE_CUDA=yes was accepted:"$'\n'"$out"
fi
grep -q "AMPGRAD_REQUIRE_CUDA must be 0 or 1, got 'yes'" <<<"$out" || fail "no message for a bad value:"$'\n'"$out"
echo "ok: $line"
