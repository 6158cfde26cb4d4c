// The fused-attention checks shared by the CPU suite (attention_test.cc) and the CUDA one
// (cuda_kernels_test.cc): on one device, the fused scaled_dot_product_attention against float64
// and against the composed path, values and the gradients of q, k and v.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "test_util.h"

namespace ampgrad::test {

struct AttentionCase {
  int64_t batch = 1, heads = 1, tq = 1, tk = 1, d = 16, dv = 16;
  bool causal = false;
  std::optional<double> scale = std::nullopt;  // scaled_dot_product_attention's (1 / sqrt(D) unset)
  double dropout_p = 0.0;  // each path draws its mask from the same generator state (manual_seed)
};

/// Ragged lengths (1, 63, 64, 65, 127, 128, 129: about the CUDA and CPU tiles' edges) x head sizes
/// (16, 64, 80, 128), causal or not; then long (1000) and unequal (Tq 65 / Tk 200, Tq 200 / Tk 65,
/// with Dv != D) sequences, head sizes that are not multiples of 8, and scales given (1 / D, as
/// muP, and a negative one).
std::vector<AttentionCase> attention_cases();
/// Cases with dropout on the probabilities (p 0.2, 0.3 and 0.5), causal or not, Tq < Tk and
/// Tq > Tk: the fused kernel must drop what the composed path's ops::dropout drops (the CPU's;
/// CUDA composes).
std::vector<AttentionCase> attention_dropout_cases();

/// For each of `dtypes` on `device`: the fused path's worst error (output and each gradient,
/// relative to its largest |value| or to 1) against float64 on the values as the dtype stores
/// them is at most `ratio` times the composed path's plus 2 eps, and within 64 eps (x
/// magnitude^2). q and k are uniform in [-magnitude, magnitude], v in [-1, 1].
::testing::AssertionResult fused_attention_as_accurate_as_composed(Device device, const AttentionCase& c,
                                                                   const std::vector<DType>& dtypes,
                                                                   double magnitude = 1.0, double ratio = 1.25);

/// Causal attention at T = 1024 over 2 heads of 64 on `device` in `dtype`: the forward keeps the
/// output and each row's log-normaliser only, and forward plus backward never hold one head's
/// float32 scores (4 MiB).
::testing::AssertionResult fused_attention_keeps_no_scores(Device device, DType dtype);

/// self_attention over qkv [batch, T, 3 x heads x d] on `device` in each of `dtypes`, causal or
/// not: its output and qkv's gradient are, bit for bit, those of splitting qkv into heads, the
/// fused scaled_dot_product_attention and merging the heads (the same kernels, other layouts),
/// and the forward allocates nothing but the output and the log-normalisers (no head copies).
::testing::AssertionResult self_attention_reads_the_heads_in_place(Device device, const std::vector<DType>& dtypes,
                                                                   int64_t batch, int64_t t, int64_t heads, int64_t d);

}  // namespace ampgrad::test
