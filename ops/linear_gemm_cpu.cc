// Packed float GEMM (see linear_gemm_cpu.h). The loop nest is GotoBLAS's:
//
//   for each column block jc of c (all of it unless k * n is very large):
//     pack b[:, jc] into kc x nr panels                      (the pool shares them; L3)
//     for each task (a range of rows and of nr-column panels), on the pool:
//       for each k block pc:  pack a[rows, pc] into mr x kc panels  (this thread's; L2)
//         for each nr-column panel jr, for each mr-row panel ir:
//           c[ir, jr] (+)= a_panel . b_panel                 (the micro-kernel; b panel in L1)
//
// The micro-kernel (its mr x nr tile and its kc and mc blocks) is picked once by instruction-set
// level (linear_gemm_micro_cpu.h). Packing lays each panel out in the order the micro-kernel reads
// it, so the kernel does nr / width aligned loads and mr broadcasts per k and nothing else.
// Packing is also where transposes disappear and FP16/BF16 become float; it uses the baseline's
// 8-wide vectors at every level (it is memory-bound). Tiles at the edges of c run the same kernel
// on zero-padded panels into a local tile.
#include "ops/linear_gemm_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>

#include "framework/dtype.h"
#include "framework/parallel.h"
#include "ops/linear_gemm_micro_cpu.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define AMPGRAD_SGEMM_AVX2 1
#endif

namespace ampgrad::kernels::cpu {

namespace {

// The vector paths of packing may write up to this many floats past a panel (the next panel, or
// the slack at the end of a buffer, takes them).
constexpr int64_t kPackSlack = 8;
// Packed b is at most this many floats (8 MB, in L3); wider c is done in column blocks.
constexpr int64_t kPackedBMax = int64_t{1} << 21;
// The float partial sums of a 16-bit result are kept between calls up to this size (16 MB).
constexpr int64_t kKeptPartialFloats = int64_t{1} << 22;
// Below this many FLOP a GEMM stays on the calling thread: waking a helper costs more than it saves.
constexpr double kParallelFlop = 4e6;
// Below this many FLOP (the seed model's 64 x 10 x 1) packing costs more than it saves: plain loops.
constexpr double kDirectFlop = 16384;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// A growable 64-byte-aligned float buffer, never value-initialised (packing overwrites it).
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

// One element, or eight, of an operand as float: widening is exact for every storage type.
inline float load1(const float* p) { return *p; }
inline float load1(const Half* p) { return half_to_float(*p); }
inline float load1(const BFloat16* p) { return bfloat16_to_float(*p); }

#ifdef AMPGRAD_SGEMM_AVX2
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
// bfloat16 is the top half of a float: zero-extend to 32 bits and shift into place.
inline __m256 load8(const BFloat16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// Transposes the 8 x 8 block held in r[0..7] (rows) into columns, in place.
inline void transpose8(__m256 r[8]) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  __m256 s[8];
  for (int i = 0; i < 8; i += 4) {
    s[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x31);
  }
}
#endif

// Calls fn(T{}) with the storage type of a GEMM operand's dtype.
template <typename Fn>
void visit_operand(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat16: return fn(Half{});
    case DType::kBFloat16: return fn(BFloat16{});
    default: return fn(float{});
  }
}

// ---- packing ---------------------------------------------------------------------------------

// The plain packing loop both panel kinds share (edges, tails, other strides):
// dst[p * width + j] = src[p * p_stride + j * j_stride] for p < kc and j < valid; zero up to width.
template <typename T>
void pack_scalar(const T* src, int64_t p_stride, int64_t j_stride, int64_t width, int64_t valid, int64_t kc,
                 float* dst) {
  for (int64_t p = 0; p < kc; ++p) {
    for (int64_t j = 0; j < width; ++j) dst[p * width + j] = j < valid ? load1(src + p * p_stride + j * j_stride) : 0.0f;
  }
}

#ifdef AMPGRAD_SGEMM_AVX2
// dst[0, width) = src[0, width), contiguous, for width 6 or a multiple of 4 from 8: full vectors,
// the last one overlapping the one before; width 6 reads 8 (src_room >= 8) and writes 2 past.
template <typename T>
inline void copy_row(const T* src, int64_t width, float* dst) {
  if (width < 8) return _mm256_storeu_ps(dst, load8(src));
  for (int64_t j = 0; j + 8 <= width; j += 8) _mm256_storeu_ps(dst + j, load8(src + j));
  if (width % 8 != 0) _mm256_storeu_ps(dst + width - 8, load8(src + width - 8));
}

// The first `count` values of v (8, 4, or 6 writing 2 more that the caller overwrites next).
inline void store_first(float* dst, __m256 v, int64_t count) {
  if (count == 4) return _mm_storeu_ps(dst, _mm256_castps256_ps128(v));
  _mm256_storeu_ps(dst, v);
}
#endif

// dst[p * nr + j] = b(p0 + p, j0 + j) for p < kc, j < nr; columns j0 + j >= n_end are zero.
template <typename T>
void pack_b_panel(const T* b, int64_t rs, int64_t cs, int64_t p0, int64_t kc, int64_t j0, int64_t n_end,
                  int64_t nr, float* dst) {
  const int64_t valid = std::min(nr, n_end - j0);
#ifdef AMPGRAD_SGEMM_AVX2
  if (valid == nr && cs == 1) {  // rows of b are contiguous: copy nr at a time
    for (int64_t p = 0; p < kc; ++p) {
      const T* src = b + (p0 + p) * rs + j0;
      for (int64_t j = 0; j < nr; j += 8) _mm256_store_ps(dst + p * nr + j, load8(src + j));
    }
    return;
  }
  if (valid == nr && rs == 1) {  // columns of b are contiguous (b is a transpose): 8 x 8 transposes
    int64_t p = 0;
    for (; p + 8 <= kc; p += 8) {
      for (int64_t j = 0; j < nr; j += 8) {
        __m256 r[8];
        for (int q = 0; q < 8; ++q) r[q] = load8(b + (j0 + j + q) * cs + p0 + p);
        transpose8(r);
        for (int q = 0; q < 8; ++q) _mm256_store_ps(dst + (p + q) * nr + j, r[q]);
      }
    }
    pack_scalar(b + j0 * cs + p0 + p, 1, cs, nr, nr, kc - p, dst + p * nr);
    return;
  }
#endif
  pack_scalar(b + p0 * rs + j0 * cs, rs, cs, nr, valid, kc, dst);
}

// dst[p * mr + i] = a(i0 + i, p0 + p) for p < kc, i < mr; rows i0 + i >= m_end are zero. a has
// m_rows rows in all. The vector paths may write kPackSlack floats past the panel.
template <typename T>
void pack_a_panel(const T* a, int64_t rs, int64_t cs, int64_t i0, int64_t m_end, int64_t m_rows, int64_t p0,
                  int64_t kc, int64_t mr, float* dst) {
  const int64_t valid = std::min(mr, m_end - i0);
#ifdef AMPGRAD_SGEMM_AVX2
  if (valid == mr && rs == 1 && i0 + std::max<int64_t>(mr, 8) <= m_rows) {  // columns of a are contiguous (a transpose)
    for (int64_t p = 0; p < kc; ++p) copy_row(a + (p0 + p) * cs + i0, mr, dst + p * mr);
    return;
  }
  if (valid == mr && cs == 1 && mr <= 16) {  // rows of a are contiguous: 8 k at a time, 8 rows at a time transposed
    int64_t p = 0;
    for (; p + 8 <= kc; p += 8) {
      __m256 r[2][8];
      for (int64_t g = 0; g < mr; g += 8) {
        for (int i = 0; i < 8; ++i) {
          r[g / 8][i] = g + i < mr ? load8(a + (i0 + g + i) * rs + p0 + p) : _mm256_setzero_ps();
        }
        transpose8(r[g / 8]);
      }
      // Column by column, so what a 6-wide store writes past a column is overwritten by the next one.
      for (int q = 0; q < 8; ++q) {
        for (int64_t g = 0; g < mr; g += 8) store_first(dst + (p + q) * mr + g, r[g / 8][q], std::min<int64_t>(8, mr - g));
      }
    }
    pack_scalar(a + i0 * rs + p0 + p, 1, rs, mr, mr, kc - p, dst + p * mr);
    return;
  }
#endif
  pack_scalar(a + i0 * rs + p0 * cs, cs, rs, mr, valid, kc, dst);
}

// ---- the driver ------------------------------------------------------------------------------

struct Problem {
  int64_t m, n, k;
  MatrixView a, b;
  const float* bias;
  float* c_float;   // float result, or float partial sums of a 16-bit result when k spans several blocks
  void* c_rounded;  // a float16 or bfloat16 result (of dtype c_dtype), or null
  DType c_dtype;
  const MicroKernel* kernel;
  int64_t kc;  // k block size (k is cut into equal blocks of at most kernel->kc)
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
    if (!to_rounded) return kernel.run(kc, a_panel, b_panel, init, init_ld, partial, n);
    kernel.run(kc, a_panel, b_panel, init, init_ld, tile, tile_ld);
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
  kernel.run(kc, a_panel, b_panel, init, init_ld, tile, tile_ld);
  if (to_rounded) return store_rounded_rows(pb, tile, tile_ld, i, j, mr, nr);
  for (int64_t r = 0; r < mr; ++r) std::copy_n(tile + r * tile_ld, nr, partial + r * n);
}

template <typename T>
void pack_a_block(const Problem& pb, int64_t i0, int64_t i1, int64_t p0, int64_t kc, float* dst) {
  const T* a = static_cast<const T*>(pb.a.data);
  const int64_t mr = pb.kernel->mr;
  for (int64_t i = i0; i < i1; i += mr) {
    pack_a_panel(a, pb.a.row_stride, pb.a.col_stride, i, i1, pb.m, p0, kc, mr, dst + (i - i0) * kc);
  }
}

// Panels [jr0, jr1) of the column block at jc, all of k. When b's rows are contiguous, groups of 8
// rows go across all the panels, so the source is read along its rows; panel by panel read one
// 64-byte piece per row, each on a new page (the step spent 8% of its time there, mostly stalled).
// When b's columns are contiguous, panel by panel is the sequential order.
template <typename T>
void pack_b_panels(const Problem& pb, int64_t jc, int64_t nc_pad, int64_t n_end, int64_t jr0, int64_t jr1,
                   float* b_packed) {
  const T* b = static_cast<const T*>(pb.b.data);
  const int64_t rs = pb.b.row_stride, cs = pb.b.col_stride, nr = pb.kernel->nr;
  for (int64_t p0 = 0; p0 < pb.k; p0 += pb.kc) {
    const int64_t kc = std::min(pb.kc, pb.k - p0);
    float* block = b_packed + p0 * nc_pad;
    if (cs == 1) {
      for (int64_t p = 0; p < kc; p += 8) {
        for (int64_t jr = jr0; jr < jr1; jr += nr) {
          pack_b_panel(b, rs, cs, p0 + p, std::min<int64_t>(8, kc - p), jc + jr, n_end, nr, block + jr * kc + p * nr);
        }
      }
    } else {
      for (int64_t jr = jr0; jr < jr1; jr += nr) pack_b_panel(b, rs, cs, p0, kc, jc + jr, n_end, nr, block + jr * kc);
    }
  }
}

// Rows [i0, i1) x panels [jr0, jr1) of the column block at jc, all of k.
void run_task(const Problem& pb, const float* b_packed, int64_t jc, int64_t nc, int64_t nc_pad, int64_t i0, int64_t i1,
              int64_t jr0, int64_t jr1) {
  thread_local Buffer a_buffer;
  const int64_t mr = pb.kernel->mr, nr = pb.kernel->nr, mc_block = pb.kernel->mc;
  const int64_t mc_max = std::min(mc_block, round_up(i1 - i0, mr));
  float* a_packed = a_buffer.get(mc_max * pb.kc + kPackSlack);
  for (int64_t ic = i0; ic < i1; ic += mc_block) {
    const int64_t mc = std::min(mc_block, i1 - ic);
    for (int64_t p0 = 0; p0 < pb.k; p0 += pb.kc) {
      const int64_t kc = std::min(pb.kc, pb.k - p0);
      visit_operand(pb.a.dtype, [&](auto t) { pack_a_block<decltype(t)>(pb, ic, ic + mc, p0, kc, a_packed); });
      for (int64_t jr = jr0; jr < jr1; jr += nr) {
        const float* b_panel = b_packed + p0 * nc_pad + jr * kc;
        const int64_t valid_nr = std::min(nr, nc - jr);
        for (int64_t ir = 0; ir < mc; ir += mr) {
          compute_tile(pb, a_packed + ir * kc, b_panel, ic + ir, jc + jr, std::min(mr, mc - ir), valid_nr, p0, kc);
        }
      }
    }
  }
}

// The same sums as the packed path, in the same order (bias or zero, then one FMA per k in turn),
// so the result is bit for bit the one the packed kernel gives.
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

// The first `n` elements of a 16-bit operand widened into `buffer` (vectorised); a float one as it is.
const float* widened(const void* data, DType dtype, int64_t n, Buffer& buffer) {
  const float* out = static_cast<const float*>(data);
  visit_operand(dtype, [&](auto t) {
    using T = decltype(t);
    if constexpr (kIsLowPrecision<T>) {
      float* wide = buffer.get(n);
      widen(static_cast<const T*>(data), wide, static_cast<size_t>(n));
      out = wide;
    }
  });
  return out;
}

// 16-bit operands are widened first (8 or 16 at a time): converting each element once per use,
// one call at a time, cost more than the whole float product.
void run_direct(Problem pb) {
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
  const MicroKernel& kernel = options.kernel != nullptr ? *options.kernel : default_micro_kernel();
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
  pb.kc = ceil_div(k, ceil_div(k, kernel.kc));
  thread_local Buffer b_buffer, partial_buffer;
  Buffer big_partial;  // freed on return: a large 16-bit product must not pin its float sums
  if (c_rounded && k > pb.kc) {  // float partial sums until the last k block
    pb.c_float = (m * n <= kKeptPartialFloats ? partial_buffer : big_partial).get(m * n);
  }

  const int64_t mr = kernel.mr, nr = kernel.nr;
  const int threads = 2.0 * m * n * k >= kParallelFlop ? num_threads() : 1;
  const int64_t nc_max = std::max(nr, kPackedBMax / k / nr * nr);
  for (int64_t jc = 0; jc < n; jc += nc_max) {
    const int64_t nc = std::min(nc_max, n - jc), nc_pad = round_up(nc, nr);
    float* b_packed = b_buffer.get(k * nc_pad);
    const int64_t panels = nc_pad / nr;
    const int64_t pack_chunks = threads > 1 && k * nc >= (int64_t{1} << 16) ? std::min<int64_t>(panels, 4 * threads) : 1;
    parallel_for(pack_chunks, [&](int64_t chunk) {
      const int64_t per = ceil_div(panels, pack_chunks);
      const int64_t jr0 = chunk * per * nr, jr1 = std::min(panels, (chunk + 1) * per) * nr;
      visit_operand(pb.b.dtype,
                    [&](auto t) { pack_b_panels<decltype(t)>(pb, jc, nc_pad, jc + nc, jr0, jr1, b_packed); });
    });

    // Two tasks per thread, so a core that is busy elsewhere delays only its share. Rows are split
    // first (each row range packs its own a); panels only when there are too few rows.
    const int64_t want = threads > 1 ? 2 * threads : 1;
    const int64_t row_parts = std::min(want, ceil_div(m, mr));
    const int64_t rows_per = round_up(ceil_div(m, row_parts), mr);
    const int64_t row_tasks = ceil_div(m, rows_per);
    const int64_t panel_parts = std::min(panels, ceil_div(want, row_tasks));
    const int64_t panels_per = ceil_div(panels, panel_parts);
    const int64_t panel_tasks = ceil_div(panels, panels_per);
    parallel_for(row_tasks * panel_tasks, [&](int64_t task) {
      const int64_t i0 = (task / panel_tasks) * rows_per, jr0 = (task % panel_tasks) * panels_per * nr;
      run_task(pb, b_packed, jc, nc, nc_pad, i0, std::min(m, i0 + rows_per), jr0, std::min(nc_pad, jr0 + panels_per * nr));
    });
  }
}

}  // namespace ampgrad::kernels::cpu
