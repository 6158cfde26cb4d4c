// Packed float GEMM (see linear_gemm_cpu.h). The loop nest is GotoBLAS's:
//
//   for each column block jc of c (all of it unless k * n is very large):
//     for each span of k (all of k unless that leaves too few columns in a block):
//       pack b[span, jc] into kc x nr panels                    (the pool shares them; L3)
//       for each task (a range of rows and of nr-column panels), on the pool:
//         for each k block pc of the span:  pack a[rows, pc] into mr x kc panels  (this thread's; L2)
//           for each nr-column panel jr, for each mr-row panel ir:
//             c[ir, jr] (+)= a_panel . b_panel               (the micro-kernel; b panel in L1)
//
// The micro-kernel (its mr x nr tile, its kc and mc blocks and its packing) is picked once per
// operand dtype by instruction-set level (linear_gemm_micro_cpu.h). Packing (linear_gemm_pack_cpu.h)
// lays each panel out in the order the micro-kernel reads it, so the kernel does nr / width
// aligned loads and mr broadcasts per packed row and nothing else; a row is one k (floats) or two
// (BF16 pairs), and the loop nest only counts rows. Tiles at the edges of c run the same kernel on
// zero-padded panels into a local tile.
#include "ops/linear/linear_gemm_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>

#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/parallel.h"
#include "ops/linear/linear_gemm_micro_cpu.h"
#include "ops/linear/linear_gemm_pack_cpu.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define AMPGRAD_SGEMM_AVX2 1
#endif

namespace ampgrad::kernels::cpu {

namespace {

// Packed b is at most this many words (8 MB, in L3); wider c is done in column blocks.
constexpr int64_t kPackedBMax = int64_t{1} << 21;
// A column block narrower than this (a long k leaves room for few columns) would pack all of a
// again for every block: k is cut into spans instead (at [512, 50304] x [50304, 768], the
// classifier's input gradient, 24 blocks of 32 columns had run at 130 GFLOP/s against the
// other products' 215).
constexpr int64_t kMinColumnBlock = 1024;
// The float partial sums of a 16-bit result are kept between calls up to this size (16 MB).
constexpr int64_t kKeptPartialFloats = int64_t{1} << 22;
// Below this many FLOP a GEMM stays on the calling thread: waking a helper costs more than it saves.
constexpr double kParallelFlop = 4e6;
// Below this many FLOP (the seed model's 64 x 10 x 1) packing costs more than it saves: plain loops
// (run_direct), which sum as the packed kernel does.
constexpr double kDirectFlop = 16384;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// A growable 64-byte-aligned float buffer, never value-initialised (packing overwrites it). Packed
// panels are kept in it as 32-bit words (floats, or BF16 pairs).
class Buffer {
 public:
  float* get(int64_t n) {
    if (n > capacity_) {
      data_.reset(static_cast<float*>(::operator new[](static_cast<size_t>(n) * sizeof(float), std::align_val_t{64})));
      capacity_ = n;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(float* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::unique_ptr<float, Free> data_;
  int64_t capacity_ = 0;
};

// ---- the driver ------------------------------------------------------------------------------

struct Problem {
  int64_t m, n, k;
  MatrixView a, b;
  const float* bias;
  float* c_float;   // float result, or float partial sums of a 16-bit result when k spans several blocks
  void* c_rounded;  // a float16 or bfloat16 result (of dtype c_dtype), or null
  DType c_dtype;
  const MicroKernel* kernel;
  int64_t kc;  // k block size (k is cut into equal blocks of at most kernel->kc, whole words but the last)

  // Rows of packed words that `k_values` k take.
  int64_t rows(int64_t k_values) const { return packed_rows(k_values, kernel->packing); }
};

// Rows of a finished tile (row stride tile_ld) leave for the 16-bit result, rounded once: F16C
// for float16, the bulk bfloat16 rounding (bfloat16.h) for bfloat16.
template <typename T>
void store_rounded_rows(const float* tile, int64_t tile_ld, int64_t mr, int64_t nr, T* c, int64_t ldc) {
#ifdef AMPGRAD_SGEMM_AVX2
  if constexpr (std::is_same_v<T, Half>) {
    if (nr % 8 == 0) {
      for (int64_t r = 0; r < mr; ++r) {
        for (int64_t h = 0; h < nr; h += 8) {
          const __m128i rounded = _mm256_cvtps_ph(_mm256_load_ps(tile + r * tile_ld + h), _MM_FROUND_TO_NEAREST_INT);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(c + r * ldc + h), rounded);
        }
      }
      return;
    }
  }
#endif
  for (int64_t r = 0; r < mr; ++r) narrow(tile + r * tile_ld, c + r * ldc, static_cast<size_t>(nr));
}

void store_rounded_rows(const Problem& pb, const float* tile, int64_t tile_ld, int64_t i, int64_t j, int64_t mr,
                        int64_t nr) {
  visit_operand(pb.c_dtype, [&](auto t) {
    using T = decltype(t);
    if constexpr (kIsLowPrecision<T>) {
      store_rounded_rows(tile, tile_ld, mr, nr, static_cast<T*>(pb.c_rounded) + i * pb.n + j, pb.n);
    }
  });
}

// The kernel's tile of c at (i, j) with mr x nr valid entries, for k block [p0, p0 + kc). The first
// k block starts from the bias (or zero), later ones from the float partial sums in c_float;
// the last block of a 16-bit result rounds the sums into c_rounded.
void compute_tile(const Problem& pb, const float* a_panel, const float* b_panel, int64_t i, int64_t j, int64_t mr,
                  int64_t nr, int64_t p0, int64_t kc) {
  const MicroKernel& kernel = *pb.kernel;
  const bool first = p0 == 0, last = p0 + kc == pb.k;
  const bool to_rounded = last && pb.c_rounded != nullptr;
  const int64_t n = pb.n, tile_ld = kernel.nr;
  float* partial = first && to_rounded ? nullptr : pb.c_float + i * n + j;  // null: no float sums kept
  alignas(64) float tile[kMaxTile];
  if (mr == kernel.mr && nr == kernel.nr) {  // the common case: straight from and into c
    const float* init = first ? (pb.bias ? pb.bias + j : nullptr) : partial;
    const int64_t init_ld = first ? 0 : n;
    if (!to_rounded) return kernel.run(pb.rows(kc), a_panel, b_panel, init, init_ld, partial, n);
    kernel.run(pb.rows(kc), a_panel, b_panel, init, init_ld, tile, tile_ld);
    return store_rounded_rows(pb, tile, tile_ld, i, j, mr, nr);
  }
  // An edge tile: the kernel works on a zero-padded copy.
  const float* init = nullptr;
  int64_t init_ld = 0;
  if (!first) {
    std::fill(tile, tile + kernel.mr * tile_ld, 0.0f);
    for (int64_t r = 0; r < mr; ++r) std::copy_n(partial + r * n, nr, tile + r * tile_ld);
    init = tile, init_ld = tile_ld;
  } else if (pb.bias != nullptr) {
    std::fill(tile, tile + tile_ld, 0.0f);
    std::copy_n(pb.bias + j, nr, tile);
    init = tile, init_ld = 0;
  }
  kernel.run(pb.rows(kc), a_panel, b_panel, init, init_ld, tile, tile_ld);
  if (to_rounded) return store_rounded_rows(pb, tile, tile_ld, i, j, mr, nr);
  for (int64_t r = 0; r < mr; ++r) std::copy_n(tile + r * tile_ld, nr, partial + r * n);
}

// Rows [i0, i1) x panels [jr0, jr1) of the column block at jc, over the k span [q0, q1) whose
// panels b_packed holds.
void run_task(const Problem& pb, const float* b_packed, int64_t jc, int64_t nc, int64_t nc_pad, int64_t q0, int64_t q1,
              int64_t i0, int64_t i1, int64_t jr0, int64_t jr1) {
  thread_local Buffer a_buffer;
  const int64_t mr = pb.kernel->mr, nr = pb.kernel->nr, mc_block = pb.kernel->mc;
  const int64_t mc_max = std::min(mc_block, round_up(i1 - i0, mr));
  float* a_packed = a_buffer.get(mc_max * pb.rows(pb.kc) + kPackSlack);
  for (int64_t ic = i0; ic < i1; ic += mc_block) {
    const int64_t mc = std::min(mc_block, i1 - ic);
    for (int64_t p0 = q0; p0 < q1; p0 += pb.kc) {
      const int64_t kc = std::min(pb.kc, pb.k - p0), rows = pb.rows(kc);
      pack_a_block(pb.a, pb.m, ic, ic + mc, p0, kc, mr, pb.kernel->packing, a_packed);
      for (int64_t jr = jr0; jr < jr1; jr += nr) {
        const float* b_panel = b_packed + pb.rows(p0 - q0) * nc_pad + jr * rows;
        const int64_t valid_nr = std::min(nr, nc - jr);
        for (int64_t ir = 0; ir < mc; ir += mr) {
          compute_tile(pb, a_packed + ir * rows, b_panel, ic + ir, jc + jr, std::min(mr, mc - ir), valid_nr, p0, kc);
        }
      }
    }
  }
}

// The column block at jc over the k span [q0, q1), on the pool. Two tasks per thread, so a core
// that is busy elsewhere delays only its share. Rows are split first (each row range packs its own
// a); panels only when there are too few rows.
void run_tasks(const Problem& pb, const float* b_packed, int64_t jc, int64_t nc, int64_t nc_pad, int64_t q0, int64_t q1,
               int threads) {
  const int64_t mr = pb.kernel->mr, nr = pb.kernel->nr, m = pb.m, panels = nc_pad / nr;
  const int64_t want = threads > 1 ? 2 * threads : 1;
  const int64_t row_parts = std::min(want, ceil_div(m, mr));
  const int64_t rows_per = round_up(ceil_div(m, row_parts), mr);
  const int64_t row_tasks = ceil_div(m, rows_per);
  const int64_t panel_parts = std::min(panels, ceil_div(want, row_tasks));
  const int64_t panels_per = ceil_div(panels, panel_parts);
  const int64_t panel_tasks = ceil_div(panels, panels_per);
  parallel_for(row_tasks * panel_tasks, [&](int64_t task) {
    const int64_t i0 = (task / panel_tasks) * rows_per, jr0 = (task % panel_tasks) * panels_per * nr;
    run_task(pb, b_packed, jc, nc, nc_pad, q0, q1, i0, std::min(m, i0 + rows_per), jr0,
             std::min(nc_pad, jr0 + panels_per * nr));
  });
}

// The same sums as a kFloat kernel's packed path, in the same order (bias or zero, then one FMA
// per k in turn), so the result is bit for bit the one the packed kernel gives.
void sgemm_direct(const Problem& pb) {
  const auto* a = static_cast<const float*>(pb.a.data);
  const auto* b = static_cast<const float*>(pb.b.data);
  for (int64_t i = 0; i < pb.m; ++i) {
    for (int64_t j = 0; j < pb.n; ++j) {
      float acc = pb.bias ? pb.bias[j] : 0.0f;
      for (int64_t p = 0; p < pb.k; ++p) {
        acc = std::fma(a[i * pb.a.row_stride + p * pb.a.col_stride], b[p * pb.b.row_stride + j * pb.b.col_stride], acc);
      }
      if (pb.c_rounded != nullptr) {
        visit_operand(pb.c_dtype, [&](auto t) {
          using T = decltype(t);
          static_cast<T*>(pb.c_rounded)[i * pb.n + j] = store<T>(acc);
        });
      } else {
        pb.c_float[i * pb.n + j] = acc;
      }
    }
  }
}

// The first `n` elements of a 16- or 8-bit operand widened into `buffer` (vectorised); a float one as it is.
const float* widened(const void* data, DType dtype, int64_t n, Buffer& buffer) {
  const float* out = static_cast<const float*>(data);
  visit_operand(dtype, [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, float>) {
      float* wide = buffer.get(n);
      widen(static_cast<const T*>(data), wide, static_cast<size_t>(n));
      out = wide;
    }
  });
  return out;
}

// A kernel with arithmetic of its own (the BF16 pair kernel: VDPBF16PS flushes subnormals) does
// small products itself, so that a row gives the same bits alone as inside a batch; it writes
// float sums, rounded here for a 16-bit c. Otherwise 16-bit operands are widened first (8 or 16 at
// a time): converting each element once per use, one call at a time, cost more than the whole
// float product.
void run_direct(Problem pb) {
  if (pb.kernel->direct != nullptr) {
    thread_local Buffer sums, a_bits, b_bits;
    // The pair kernel reads bfloat16: 8-bit float operands become their exact bfloat16 bits first.
    const auto as_bfloat16 = [](MatrixView& v, int64_t rows, int64_t cols, Buffer& buffer) {
      if (!is_float8(v.dtype)) return;
      const int64_t span = rows == 0 || cols == 0 ? 0 : (rows - 1) * v.row_stride + (cols - 1) * v.col_stride + 1;
      auto* bits = reinterpret_cast<uint16_t*>(buffer.get((span + 1) / 2));
      const uint16_t* table = float8_bf16_table(v.dtype);
      const auto* codes = static_cast<const uint8_t*>(v.data);
      for (int64_t i = 0; i < span; ++i) bits[i] = table[codes[i]];
      v = {bits, DType::kBFloat16, v.row_stride, v.col_stride};
    };
    as_bfloat16(pb.a, pb.m, pb.k, a_bits);
    as_bfloat16(pb.b, pb.k, pb.n, b_bits);
    float* c = pb.c_rounded != nullptr ? sums.get(pb.m * pb.n) : pb.c_float;
    pb.kernel->direct(pb.m, pb.n, pb.k, pb.a, pb.b, pb.bias, c);
    if (pb.c_rounded != nullptr) store_rounded_rows(pb, c, pb.n, 0, 0, pb.m, pb.n);
    return;
  }
  thread_local Buffer a_wide, b_wide;
  const auto widen_view = [](MatrixView& v, int64_t rows, int64_t cols, Buffer& buffer) {
    const int64_t span = rows == 0 || cols == 0 ? 0 : (rows - 1) * v.row_stride + (cols - 1) * v.col_stride + 1;
    v = {widened(v.data, v.dtype, span, buffer), DType::kFloat32, v.row_stride, v.col_stride};
  };
  widen_view(pb.a, pb.m, pb.k, a_wide);
  widen_view(pb.b, pb.k, pb.n, b_wide);
  sgemm_direct(pb);
}

}  // namespace

void sgemm(int64_t m, int64_t n, int64_t k, const MatrixView& a, const MatrixView& b, const MatrixView& bias, void* c,
           DType c_dtype, const GemmOptions& options) {
  if (m == 0 || n == 0) return;
  const bool c_rounded = is_low_precision(c_dtype);
  // bfloat16 and the 8-bit floats (exact in bfloat16) go to the BF16 pair kernel where there is one.
  const auto pairable = [](DType d) { return d == DType::kBFloat16 || is_float8(d); };
  const bool pairs = pairable(a.dtype) && pairable(b.dtype);
  const MicroKernel& kernel =
      options.kernel != nullptr ? *options.kernel : default_micro_kernel(pairs ? DType::kBFloat16 : DType::kFloat32);
  AG_CHECK(kernel.packing == Packing::kFloat || pairs, "sgemm: the ", kernel.name,
           " kernel multiplies bfloat16 (or 8-bit float) operands, not ", a.dtype, " by ", b.dtype);
  thread_local Buffer wide_bias;  // a 16-bit bias is widened once into a buffer reused across calls
  Problem pb{m, n, k, a, b, nullptr, nullptr, nullptr, c_dtype, &kernel, 0};
  if (bias.data != nullptr) pb.bias = widened(bias.data, bias.dtype, n, wide_bias);
  if (c_rounded) {
    pb.c_rounded = c;
  } else {
    pb.c_float = static_cast<float*>(c);
  }
  if (2.0 * m * n * k < kDirectFlop) return run_direct(pb);  // k = 0 included: c is the bias, or zero

  // Equal k blocks: 784 becomes 4 x 196, not 3 x 256 + 16 (a short block pays the c traffic for little work).
  // Each but the last fills whole words (kernel.kc is a multiple of k_per_word), so block p0 starts at row p0 / k_per_word.
  pb.kc = round_up(ceil_div(k, ceil_div(k, kernel.kc)), k_per_word(kernel.packing));
  thread_local Buffer b_buffer, partial_buffer;
  Buffer big_partial;  // freed on return: a large 16-bit product must not pin its float sums
  if (c_rounded && k > pb.kc) {  // float partial sums until the last k block
    pb.c_float = (m * n <= kKeptPartialFloats ? partial_buffer : big_partial).get(m * n);
  }

  const int64_t nr = kernel.nr;
  const int threads = 2.0 * m * n * k >= kParallelFlop ? num_threads() : 1;
  // The packed block of b: all of k for as many columns as fit, or, where that is too few (or not
  // even one panel fits), spans of whole k blocks for wider columns (the same k blocks either way,
  // so the same sums).
  int64_t nc_max = std::max(nr, kPackedBMax / pb.rows(k) / nr * nr), k_span = k;
  if (nc_max < std::min(round_up(n, nr), kMinColumnBlock) || pb.rows(k) * nr > kPackedBMax) {
    nc_max = std::min(round_up(n, nr), std::max(nr, kPackedBMax / pb.rows(pb.kc) / nr * nr));
    k_span = std::max<int64_t>(1, kPackedBMax / (pb.rows(pb.kc) * nc_max)) * pb.kc;
  }
  for (int64_t jc = 0; jc < n; jc += nc_max) {
    const int64_t nc = std::min(nc_max, n - jc), nc_pad = round_up(nc, nr);
    const int64_t panels = nc_pad / nr;
    for (int64_t q0 = 0; q0 < k; q0 += k_span) {
      const int64_t q1 = std::min(k, q0 + k_span);
      float* b_packed = b_buffer.get(pb.rows(q1 - q0) * nc_pad);
      const int64_t pack_chunks =
          threads > 1 && (q1 - q0) * nc >= (int64_t{1} << 16) ? std::min<int64_t>(panels, 4 * threads) : 1;
      parallel_for(pack_chunks, [&](int64_t chunk) {
        const int64_t per = ceil_div(panels, pack_chunks);
        const int64_t jr0 = chunk * per * nr, jr1 = std::min(panels, (chunk + 1) * per) * nr;
        for (int64_t p0 = q0; p0 < q1; p0 += pb.kc) {  // each k block's panels follow the ones before
          const int64_t kc = std::min(pb.kc, k - p0);
          pack_b_block(pb.b, p0, kc, jc + jr0, jc + jr1, jc + nc, nr, kernel.packing,
                       b_packed + pb.rows(p0 - q0) * nc_pad + jr0 * pb.rows(kc));
        }
      });
      run_tasks(pb, b_packed, jc, nc, nc_pad, q0, q1, threads);
    }
  }
}

}  // namespace ampgrad::kernels::cpu
