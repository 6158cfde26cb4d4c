// Fused attention on the CPU. Each tile product is one call of the packed GEMM
// (linear/linear_gemm_cpu.h), which reads float16/bfloat16 operands where they lie while packing
// them, so q, k, v and dout are never copied (nor split into heads: each operand's rows are read
// where its layout puts them). The softmax runs in float32 over a tile of scores that stays in
// cache; with bfloat16 inputs the products after it take its tiles rounded to bfloat16
// (kRoundsTiles). The forward runs (batch, query tile) pairs on the pool; the backward runs one
// batch entry per task, its tiles in a fixed order, so no two tasks add to the same gradient and
// the bits do not depend on the thread count. Dropout on the probabilities draws each element's
// keep from a counter-based hash of its index (dropout_mask.h, as ops::dropout), so the backward
// regenerates the forward's mask tile by tile.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "framework/error.h"
#include "framework/parallel.h"
#include "ops/attention/attention_kernels.h"
#include "ops/elementwise/dropout_mask.h"
#include "ops/linear/linear_gemm_cpu.h"
#include "ops/math.h"
#include "ops/softmax/softmax_rows_cpu.h"
#include "ops/wide_loops_cpu.h"

namespace ampgrad::kernels::cpu {

namespace {

using rows::finite_shift;
using rows::row_max;
using rows::sum_exp;

// A 128 x 128 float score tile is 64 KiB (in L2). Each tile product packs its operands, so taller
// query tiles pack k and v for more rows at once: 64 -> 128 rows took causal attention at T = 1024
// ([2, 12, T, 64], forward + backward, one thread) 2% faster in float32 and 5% in bfloat16.
constexpr int64_t kQueryTile = 128;  // rows of q per tile
constexpr int64_t kKeyTile = 128;    // rows of k and v per tile

// A tile that the causal diagonal crosses runs in blocks of kDiagonalRows query rows, each only as
// wide as its last row sees: a 128 x 128 diagonal tile then computes 5/8 of its scores and
// products instead of all of them (at T = 256, two of the three tiles a head computes are
// diagonal ones). The keys a block skips would only have added products with a probability of 0.
constexpr int64_t kDiagonalRows = 32;

// Batch entry b's rows from r0 on, as its layout places them in t.
MatrixView rows_of(const Tensor& t, const RowLayout& layout, int64_t b, int64_t r0) {
  const auto* base = static_cast<const char*>(t.data_ptr());
  const int64_t offset = layout.at(b, r0) * static_cast<int64_t>(dtype_info(t.dtype()).size);
  return {.data = base + offset, .dtype = t.dtype(), .row_stride = layout.row_stride, .col_stride = 1};
}

MatrixView transposed(MatrixView m) {
  std::swap(m.row_stride, m.col_stride);
  return m;
}

MatrixView floats(const float* data, int64_t row_stride) {
  return {.data = data, .dtype = DType::kFloat32, .row_stride = row_stride, .col_stride = 1};
}

// c [m, n] (row-major float) = a b. Inside a pool task it runs on the calling thread; its bits do
// not depend on that either way.
void gemm(int64_t m, int64_t n, int64_t k, const MatrixView& a, const MatrixView& b, float* c) {
  sgemm(m, n, k, a, b, MatrixView{}, c, DType::kFloat32);
}

// How many keys a query row sees (keys 0 .. keys_seen - 1): all of them, or (causal) the keys up to
// its own index.
int64_t keys_seen(const AttentionShape& s, int64_t row) { return s.causal ? std::min(s.tk, row + 1) : s.tk; }

// f(r0, n, seen) for each block of the tile [i0, i0 + rows) x [j0, j0 + cols): rows i0 + r0 ..
// i0 + r0 + n - 1 and the first `seen` of the tile's keys (those the block's last row sees). One
// block when every row sees every key, else blocks of kDiagonalRows rows; a block that sees none
// of the keys is skipped.
template <typename F>
void for_each_row_block(const AttentionShape& s, int64_t i0, int64_t rows, int64_t j0, int64_t cols, F&& f) {
  const int64_t step = keys_seen(s, i0) >= j0 + cols ? rows : kDiagonalRows;
  for (int64_t r0 = 0; r0 < rows; r0 += step) {
    const int64_t n = std::min(step, rows - r0);
    const int64_t seen = std::min(cols, keys_seen(s, i0 + r0 + n - 1) - j0);
    if (seen > 0) f(r0, n, seen);
  }
}

// Scores of a tile, scaled, with keys a row does not see set to -inf; returns nothing. scores is
// [rows, cols] for query rows i0.. and key columns j0...
void scale_and_mask(float* scores, int64_t rows, int64_t cols, int64_t i0, int64_t j0, const AttentionShape& s) {
  const auto scale = static_cast<float>(s.scale);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = scores + r * cols;
    const int64_t seen = std::clamp<int64_t>(keys_seen(s, i0 + r) - j0, 0, cols);
    for (int64_t c = 0; c < seen; ++c) row[c] *= scale;
    for (int64_t c = seen; c < cols; ++c) row[c] = -std::numeric_limits<float>::infinity();
  }
}

// Dropout on a [rows, cols] tile of batch entry b (query rows from i0, keys from j0): an element is
// kept, times 1 / (1 - p), where ops::dropout over the probabilities [batch, Tq, Tk] keeps it, else
// 0. The forward applies it to P before P v (the row sums stay those of P), the backward to the
// P^T dout operand and to dP = dout v^T. The keeps are hashed once per tile into multipliers
// (0 or 1 / (1 - p)); the AVX-512 build hashes 8 indices a vector (64-bit multiplies).
struct DropoutMultipliers {
  [[gnu::always_inline]] static void run(float* multipliers, int64_t rows, int64_t cols, uint64_t first,
                                         int64_t row_step, uint64_t seed, float threshold, float keep_scale) {
    for (int64_t r = 0; r < rows; ++r) {
      const uint64_t at = first + static_cast<uint64_t>(r * row_step);
      float* m = multipliers + r * cols;
      for (int64_t c = 0; c < cols; ++c) {
        m[c] = dropout_uniform(seed, at + static_cast<uint64_t>(c)) >= threshold ? keep_scale : 0.0f;
      }
    }
  }
};

// x = x * multiplier where kept, else 0 (as ops::dropout: a dropped inf or NaN gives 0 too).
struct ApplyDropout {
  [[gnu::always_inline]] static void run(float* dst, const float* src, const float* multipliers, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dst[i] = multipliers[i] != 0.0f ? src[i] * multipliers[i] : 0.0f;
  }
};

void dropout_multipliers(bool wide, float* multipliers, int64_t rows, int64_t cols, int64_t b, int64_t i0, int64_t j0,
                         const AttentionShape& s) {
  run_loop<DropoutMultipliers>(wide, multipliers, rows, cols, static_cast<uint64_t>((b * s.tq + i0) * s.tk + j0), s.tk,
                               s.dropout_seed, static_cast<float>(s.dropout_p),
                               s.dropout_p < 1 ? static_cast<float>(1.0 / (1.0 - s.dropout_p)) : 0.0f);
}

// The products after the softmax (P v in the forward; P^T dout, dS k and dS^T q in the backward)
// take P and dS rounded to bfloat16 when the inputs are bfloat16, as PyTorch's fused CPU kernel
// and FlashAttention's do: both operands are then bfloat16, so the GEMM runs its pair kernel
// (VDPBF16PS, twice the float kernel's rate where the CPU has it). The sums stay float. float16
// inputs keep float tiles: their products are widened to float either way.
template <typename T>
inline constexpr bool kRoundsTiles = std::is_same_v<T, BFloat16>;

// A [rows, cols] float tile as the operand of such a product: the tile, or its bfloat16 copy in
// `rounded` (at least rows x cols).
template <typename T>
MatrixView tile_operand(const float* tile, int64_t rows, int64_t cols, std::vector<T>& rounded) {
  if constexpr (kRoundsTiles<T>) {
    narrow(tile, rounded.data(), static_cast<size_t>(rows * cols));
    return {.data = rounded.data(), .dtype = DType::kBFloat16, .row_stride = cols, .col_stride = 1};
  } else {
    (void)rounded;
    return floats(tile, cols);
  }
}

// A [rows, cols] float block into batch entry b's rows from r0 on, rounded once.
template <typename T>
void store_rows(const float* src, int64_t rows, int64_t cols, T* dst, const RowLayout& layout, int64_t b, int64_t r0) {
  for (int64_t r = 0; r < rows; ++r) {
    T* row = dst + layout.at(b, r0 + r);
    for (int64_t c = 0; c < cols; ++c) row[c] = store<T>(src[r * cols + c]);
  }
}

// The loops between the tile products, built for the baseline and for AVX-512 (wide_loops_cpu.h;
// tests/attention_test.cc holds the two to the same bits).

// The forward's online softmax over a block's scores [n, cols] (rows r of max, sum and acc): a
// row's running maximum m and sum l; an earlier tile's share of the sum and of the output is
// rescaled by exp(m_old - m_new) when the maximum grows. The scores become exp(s - m); a masked
// score (-inf) gives 0.
struct OnlineSoftmax {
  [[gnu::always_inline]] static void run(float* scores, int64_t n, int64_t cols, float* max, float* sum, float* acc,
                                         int64_t dv) {
    for (int64_t r = 0; r < n; ++r) {
      float* p = scores + r * cols;
      const float m = std::max(max[r], row_max(p, cols));
      const float rescale = math::exp(max[r] - m);  // 0 on the first tile (m_old = -inf)
      const double tile_sum = sum_exp<true>(p, cols, finite_shift(m), p);
      sum[r] = sum[r] * rescale + static_cast<float>(tile_sum);
      max[r] = m;
      if (rescale != 1.0f) {
        for (int64_t c = 0; c < dv; ++c) acc[r * dv + c] *= rescale;
      }
    }
  }
};

// The backward's probabilities: scores [rows, cols] become p = exp((s - m) - log_sum), with each
// row's two log-normaliser parts at lse[2 r], lse[2 r + 1]; a masked score gives 0.
struct Probabilities {
  [[gnu::always_inline]] static void run(float* scores, int64_t rows, int64_t cols, const float* lse) {
    for (int64_t r = 0; r < rows; ++r) {
      const float max = lse[2 * r], log_sum = lse[2 * r + 1];
      float* pr = scores + r * cols;
      for (int64_t c = 0; c < cols; ++c) {
        pr[c] = pr[c] == -std::numeric_limits<float>::infinity() ? 0.0f : math::exp((pr[c] - max) - log_sum);
      }
    }
  }
};

// dS = P (dP - delta) scale over [rows, cols], where ds holds dP on entry (dout v^T, dropped as P
// was) and delta has one value per row.
struct ScoreGradients {
  [[gnu::always_inline]] static void run(float* ds, const float* p, int64_t rows, int64_t cols, const float* delta,
                                         float scale) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t at = r * cols + c;
        ds[at] = p[at] * (ds[at] - delta[r]) * scale;
      }
    }
  }
};

}  // namespace

void flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionShape& s, Tensor& out,
                     Tensor& lse, CpuIsa isa) {
  const bool wide = wide_loops(isa);
  const int64_t q_tiles = (s.tq + kQueryTile - 1) / kQueryTile;
  float* lse_out = lse.data<float>();
  visit_floating_dtype(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, double>) {
      AG_FAIL("flash_attention: float64 runs the composed path");
    } else {
      T* o = out.data<T>();
      parallel_for(s.batch * q_tiles, [&](int64_t task) {
        const int64_t b = task / q_tiles, i0 = (task % q_tiles) * kQueryTile;
        const int64_t rows = std::min(kQueryTile, s.tq - i0);
        std::vector<T> rounded(kRoundsTiles<T> ? static_cast<size_t>(kQueryTile * kKeyTile) : 0);
        std::vector<float> scores(static_cast<size_t>(kQueryTile * kKeyTile)),
            acc(static_cast<size_t>(rows * s.dv), 0.0f), pv(static_cast<size_t>(rows * s.dv)),
            max(static_cast<size_t>(rows), -std::numeric_limits<float>::infinity()),
            sum(static_cast<size_t>(rows), 0.0f), keep(s.dropout_p > 0 ? scores.size() : 0);
        const int64_t keys = keys_seen(s, i0 + rows - 1);  // the tile's last row sees the most
        for (int64_t j0 = 0; j0 < keys; j0 += kKeyTile) {
          const int64_t cols = std::min(kKeyTile, s.tk - j0);
          for_each_row_block(s, i0, rows, j0, cols, [&](int64_t r0, int64_t n, int64_t seen) {
            float* acc_rows = acc.data() + r0 * s.dv;
            gemm(n, seen, s.d, rows_of(q, s.q, b, i0 + r0), transposed(rows_of(k, s.k, b, j0)), scores.data());
            scale_and_mask(scores.data(), n, seen, i0 + r0, j0, s);
            run_loop<OnlineSoftmax>(wide, scores.data(), n, seen, max.data() + r0, sum.data() + r0, acc_rows, s.dv);
            if (s.dropout_p > 0) {
              dropout_multipliers(wide, keep.data(), n, seen, b, i0 + r0, j0, s);
              run_loop<ApplyDropout>(wide, scores.data(), scores.data(), keep.data(), n * seen);
            }
            gemm(n, s.dv, seen, tile_operand(scores.data(), n, seen, rounded), rows_of(v, s.v, b, j0), pv.data());
            for (int64_t i = 0; i < n * s.dv; ++i) acc_rows[i] += pv[static_cast<size_t>(i)];
          });
        }
        for (int64_t r = 0; r < rows; ++r) {
          const float inv = 1.0f / sum[r];
          for (int64_t c = 0; c < s.dv; ++c) acc[r * s.dv + c] *= inv;
          lse_out[2 * (b * s.tq + i0 + r)] = max[r];
          lse_out[2 * (b * s.tq + i0 + r) + 1] = std::log(sum[r]);
        }
        store_rows(acc.data(), rows, s.dv, o, s.out, b, i0);
      });
    }
  });
}

void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& dout, const AttentionShape& s, Tensor& dq, Tensor& dk, Tensor& dv,
                              CpuIsa isa) {
  const bool wide = wide_loops(isa);
  const float* lse_in = lse.data<float>();
  visit_floating_dtype(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, double>) {
      AG_FAIL("flash_attention_backward: float64 runs the composed path");
    } else {
      const T* o = out.data<T>();
      const T* g = dout.data<T>();
      parallel_for(s.batch, [&](int64_t b) {
        // delta_i = sum_c dout_ic out_ic: softmax's backward term, per query row.
        std::vector<float> delta(static_cast<size_t>(s.tq));
        for (int64_t i = 0; i < s.tq; ++i) {
          const int64_t at = s.out.at(b, i);
          float dot = 0.0f;
          for (int64_t c = 0; c < s.dv; ++c) dot += load(g[at + c]) * load(o[at + c]);
          delta[static_cast<size_t>(i)] = dot;
        }
        std::vector<float> dq_acc(static_cast<size_t>(s.tq * s.d), 0.0f), dk_acc(static_cast<size_t>(s.tk * s.d), 0.0f),
            dv_acc(static_cast<size_t>(s.tk * s.dv), 0.0f);
        std::vector<T> rounded(kRoundsTiles<T> ? static_cast<size_t>(kQueryTile * kKeyTile) : 0);
        std::vector<float> p(static_cast<size_t>(kQueryTile * kKeyTile)), ds(p.size()),
            tmp(static_cast<size_t>(std::max(kQueryTile, kKeyTile) * std::max(s.d, s.dv))),
            keep(s.dropout_p > 0 ? p.size() : 0), dropped(keep.size());
        const auto add = [&](float* dst, int64_t n) {
          for (int64_t i = 0; i < n; ++i) dst[i] += tmp[static_cast<size_t>(i)];
        };
        for (int64_t j0 = 0; j0 < s.tk; j0 += kKeyTile) {
          const int64_t cols = std::min(kKeyTile, s.tk - j0);
          const MatrixView k_tile = rows_of(k, s.k, b, j0), v_tile = rows_of(v, s.v, b, j0);
          // Causal: query rows before j0 see none of these keys.
          for (int64_t i0 = s.causal ? j0 / kQueryTile * kQueryTile : 0; i0 < s.tq; i0 += kQueryTile) {
            const int64_t tile_rows = std::min(kQueryTile, s.tq - i0);
            for_each_row_block(s, i0, tile_rows, j0, cols, [&](int64_t r0, int64_t n, int64_t seen) {
              const int64_t i = i0 + r0;  // the block's first query row
              const MatrixView q_tile = rows_of(q, s.q, b, i), g_tile = rows_of(dout, s.out, b, i);
              gemm(n, seen, s.d, q_tile, transposed(k_tile), p.data());
              scale_and_mask(p.data(), n, seen, i, j0, s);
              run_loop<Probabilities>(wide, p.data(), n, seen, lse_in + 2 * (b * s.tq + i));
              // dv_j += Z^T dout_i, Z = P or, with dropout, P dropped
              const float* z = p.data();
              if (s.dropout_p > 0) {
                dropout_multipliers(wide, keep.data(), n, seen, b, i, j0, s);
                run_loop<ApplyDropout>(wide, dropped.data(), static_cast<const float*>(p.data()),
                                       static_cast<const float*>(keep.data()), n * seen);
                z = dropped.data();
              }
              gemm(seen, s.dv, n, transposed(tile_operand(z, n, seen, rounded)), g_tile, tmp.data());
              add(dv_acc.data() + j0 * s.dv, seen * s.dv);
              // dS = P (dP - delta) scale, dP = dout_i v_j^T (dropped as Z was: delta = rowsum(dout out)
              // still, since out = Z v)
              gemm(n, seen, s.dv, g_tile, transposed(v_tile), ds.data());
              if (s.dropout_p > 0) {
                run_loop<ApplyDropout>(wide, ds.data(), static_cast<const float*>(ds.data()),
                                       static_cast<const float*>(keep.data()), n * seen);
              }
              const auto scale = static_cast<float>(s.scale);
              run_loop<ScoreGradients>(wide, ds.data(), p.data(), n, seen, delta.data() + i, scale);
              // dq_i += dS k_j;  dk_j += dS^T q_i
              const MatrixView ds_tile = tile_operand(ds.data(), n, seen, rounded);
              gemm(n, s.d, seen, ds_tile, k_tile, tmp.data());
              add(dq_acc.data() + i * s.d, n * s.d);
              gemm(seen, s.d, n, transposed(ds_tile), q_tile, tmp.data());
              add(dk_acc.data() + j0 * s.d, seen * s.d);
            });
          }
        }
        store_rows(dq_acc.data(), s.tq, s.d, dq.data<T>(), s.q, b, 0);
        store_rows(dk_acc.data(), s.tk, s.d, dk.data<T>(), s.k, b, 0);
        store_rows(dv_acc.data(), s.tk, s.dv, dv.data<T>(), s.v, b, 0);
      });
    }
  });
}

}  // namespace ampgrad::kernels::cpu
