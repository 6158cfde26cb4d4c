// Fused attention on CUDA for float16 and bfloat16: the FlashAttention-2 algorithm on tensor cores
// (WMMA 16x16x16 fragments, float accumulators). A block of 4 warps owns a 64-row tile; each warp
// owns 16 of its rows, so the online softmax of a row needs only its own warp. Tiles are staged in
// shared memory, zero-padded to whole fragments (D and Dv rounded up to 16), so any D <= 128 runs.
//   forward: one block per (query tile, batch entry): S = Q K^T, the online softmax in float32,
//     O += P V with P rounded to the inputs' dtype (as FlashAttention's), then O / l.
//   backward: delta = rowsum(dO * O); one block per key tile writes dK and dV, one block per query
//     tile writes dQ, each recomputing P from the forward's (max, log_sum): no atomics, so the
//     gradients are deterministic. P and dS are rounded to the inputs' dtype before their products
//     (dV = P^T dO; dK, dQ from dS), as FlashAttention's are; the CPU keeps them in float32.
#include <mma.h>

#include <limits>

#include "framework/cuda_check.h"
#include "framework/cuda_helpers.h"
#include "framework/device_cuda.h"
#include "framework/error.h"
#include "ops/attention/attention_kernels.h"

namespace ampgrad::kernels::cuda {

namespace {

using namespace ::ampgrad::cuda;  // the device helpers of framework/cuda_helpers.h
namespace wmma = nvcuda::wmma;

constexpr int kTile = 64;  // rows of a query or key tile
constexpr int kWarps = 4;  // each owns 16 rows of a tile
constexpr int kBlock = kWarps * 32;
constexpr int kFrag = 16;

struct Params {
  int64_t tq, tk;
  int d, dv, dp, dvp;  // head sizes and their rounding up to whole fragments
  bool causal;
  float scale;
  RowLayout q, k, v, out;  // where each operand's rows lie (dq, dk, dv as q, k, v; dO as out)
};

__host__ __device__ constexpr int round_up16(int n) { return (n + 15) / 16 * 16; }

// Shared memory carved in 128-byte-aligned pieces (WMMA wants 32-byte-aligned fragment pointers).
struct Carver {
  unsigned char* base;
  size_t used = 0;
  template <typename U>
  __device__ U* take(size_t count) {
    U* p = reinterpret_cast<U*>(base + used);
    used += (count * sizeof(U) + 127) / 128 * 128;
    return p;
  }
};

__host__ __device__ constexpr size_t piece(size_t bytes) { return (bytes + 127) / 128 * 128; }

// The keys query row `row` sees: all, or (causal, top-left aligned) those up to its own index.
__device__ int64_t keys_seen(const Params& p, int64_t row) {
  return p.causal ? (row + 1 < p.tk ? row + 1 : p.tk) : p.tk;
}

// Rows [row0, row0 + 64) of batch entry b's [rows, cols] matrix, where `layout` puts them in src,
// into a [64, cols_p] tile, zero-padded.
template <typename T>
__device__ void load_tile(T* dst, const T* src, const RowLayout& layout, int64_t b, int64_t row0, int64_t rows,
                          int cols, int cols_p) {
  const T* first = src + layout.at(b, 0);  // one division per call, not per element
  for (int idx = threadIdx.x; idx < kTile * cols_p; idx += blockDim.x) {
    const int r = idx / cols_p, c = idx % cols_p;
    const int64_t gr = row0 + r;
    dst[idx] = gr < rows && c < cols ? first[gr * layout.row_stride + c] : dstore<T>(0.0f);
  }
}

__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// This warp's c[16, n] = a[16, k] b^T, b stored row-major [n, k] (ldb): "scores" products.
template <typename T>
__device__ void mma_abt(float* c, int ldc, const T* a, int lda, const T* b, int ldb, int k, int n) {
  for (int nb = 0; nb < n / kFrag; ++nb) {
    wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kb = 0; kb < k / kFrag; ++kb) {
      wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, T, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, T, wmma::col_major> fb;
      wmma::load_matrix_sync(fa, a + kb * kFrag, lda);
      wmma::load_matrix_sync(fb, b + nb * kFrag * ldb + kb * kFrag, ldb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(c + nb * kFrag, acc, ldc, wmma::mem_row_major);
  }
}

// This warp's c[16, n] += a[16, k] b, b row-major [k, n]; with A_TRANSPOSED, a is stored as the
// row-major [k, 16] block a^T (lda its row length): the P^T dO and dS^T Q products.
template <bool kATransposed, typename T>
__device__ void mma_ab_acc(float* c, int ldc, const T* a, int lda, const T* b, int ldb, int k, int n) {
  using ALayout = std::conditional_t<kATransposed, wmma::col_major, wmma::row_major>;
  for (int nb = 0; nb < n / kFrag; ++nb) {
    wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float> acc;
    wmma::load_matrix_sync(acc, c + nb * kFrag, ldc, wmma::mem_row_major);
    for (int kb = 0; kb < k / kFrag; ++kb) {
      wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, T, ALayout> fa;
      wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, T, wmma::row_major> fb;
      wmma::load_matrix_sync(fa, kATransposed ? a + kb * kFrag * lda : a + kb * kFrag, lda);
      wmma::load_matrix_sync(fb, b + kb * kFrag * ldb + nb * kFrag, ldb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(c + nb * kFrag, acc, ldc, wmma::mem_row_major);
  }
}

size_t forward_smem(const Params& p, size_t elem) {
  return piece(kTile * p.dp * elem) * 2 + piece(kTile * p.dvp * elem) + piece(kTile * kTile * 4) +
         piece(kTile * kTile * elem) + piece(kTile * p.dvp * 4) + 2 * piece(kTile * 4);
}

template <typename T>
__global__ void __launch_bounds__(kBlock) flash_forward_kernel(const T* q, const T* k, const T* v, T* out, float* lse,
                                                               Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  Carver carve{smem};
  T* qs = carve.take<T>(kTile * p.dp);
  T* ks = carve.take<T>(kTile * p.dp);
  T* vs = carve.take<T>(kTile * p.dvp);
  float* ss = carve.take<float>(kTile * kTile);
  T* ps = carve.take<T>(kTile * kTile);
  float* os = carve.take<float>(kTile * p.dvp);
  float* row_max = carve.take<float>(kTile);
  float* row_sum = carve.take<float>(kTile);

  const int64_t b = blockIdx.y, i0 = int64_t{blockIdx.x} * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  load_tile(qs, q, p.q, b, i0, p.tq, p.d, p.dp);
  for (int idx = threadIdx.x; idx < kTile * p.dvp; idx += blockDim.x) os[idx] = 0.0f;
  for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
    row_max[r] = -std::numeric_limits<float>::infinity();
    row_sum[r] = 0.0f;
  }
  const int64_t keys = keys_seen(p, i0 + kTile - 1);
  for (int64_t j0 = 0; j0 < keys; j0 += kTile) {
    __syncthreads();  // the previous tile's K and V are no longer read
    load_tile(ks, k, p.k, b, j0, p.tk, p.d, p.dp);
    load_tile(vs, v, p.v, b, j0, p.tk, p.dv, p.dvp);
    __syncthreads();
    float* s_rows = ss + warp * kFrag * kTile;
    mma_abt(s_rows, kTile, qs + warp * kFrag * p.dp, p.dp, ks, p.dp, p.dp, kTile);
    __syncwarp();
    for (int r = 0; r < kFrag; ++r) {
      const int row = warp * kFrag + r;
      const int64_t seen = keys_seen(p, i0 + row);
      float s[2];
      bool valid[2];
      for (int h = 0; h < 2; ++h) {
        const int c = lane + 32 * h;
        valid[h] = j0 + c < seen;
        s[h] = valid[h] ? s_rows[r * kTile + c] * p.scale : -std::numeric_limits<float>::infinity();
      }
      const float old_max = row_max[row];
      const float new_max = fmaxf(old_max, warp_max(fmaxf(s[0], s[1])));
      float e[2];
      for (int h = 0; h < 2; ++h) e[h] = valid[h] ? expf(s[h] - new_max) : 0.0f;
      const float tile_sum = warp_sum(e[0] + e[1]);
      const float rescale = old_max == -std::numeric_limits<float>::infinity() ? 0.0f : expf(old_max - new_max);
      for (int c = lane; c < p.dvp; c += 32) os[row * p.dvp + c] *= rescale;
      for (int h = 0; h < 2; ++h) ps[row * kTile + lane + 32 * h] = dstore<T>(e[h]);
      __syncwarp();  // every lane has read row_max[row]
      if (lane == 0) {
        row_max[row] = new_max;
        row_sum[row] = row_sum[row] * rescale + tile_sum;
      }
    }
    __syncwarp();
    mma_ab_acc<false>(os + warp * kFrag * p.dvp, p.dvp, ps + warp * kFrag * kTile, kTile, vs, p.dvp, kTile, p.dvp);
  }
  __syncwarp();
  for (int r = 0; r < kFrag; ++r) {
    const int row = warp * kFrag + r;
    const int64_t gi = i0 + row;
    if (gi >= p.tq) break;
    const float inv = 1.0f / row_sum[row];
    T* o = out + p.out.at(b, gi);
    for (int c = lane; c < p.dv; c += 32) o[c] = dstore<T>(os[row * p.dvp + c] * inv);
    if (lane == 0) {
      lse[2 * (b * p.tq + gi)] = row_max[row];
      lse[2 * (b * p.tq + gi) + 1] = logf(row_sum[row]);
    }
  }
}

// delta[b Tq + i] = sum_c dout[b, i, c] out[b, i, c]: one warp per row.
template <typename T>
__global__ void delta_kernel(const T* out, const T* dout, int64_t rows, Params p, float* delta) {
  const int64_t row = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int64_t at = p.out.at(row / p.tq, row % p.tq);
  float dot = 0.0f;
  for (int c = lane; c < p.dv; c += 32) dot += dload(dout[at + c]) * dload(out[at + c]);
  dot = warp_sum(dot);
  if (lane == 0) delta[row] = dot;
}

// A [64, cols_p] float tile into rows [row0, row0 + 64) of batch entry b's [rows, cols] matrix,
// where `layout` puts them in dst, rounded once; padding and rows past the end are not written.
template <typename T>
__device__ void store_tile(T* dst, const float* src, const RowLayout& layout, int64_t b, int64_t row0, int64_t rows,
                           int cols, int cols_p) {
  T* first = dst + layout.at(b, 0);
  for (int idx = threadIdx.x; idx < kTile * cols_p; idx += blockDim.x) {
    const int r = idx / cols_p, c = idx % cols_p;
    if (row0 + r < rows && c < cols) first[(row0 + r) * layout.row_stride + c] = dstore<T>(src[idx]);
  }
}

// The shared tiles both backward kernels use, in the order backward_smem counts them: q, k, v and
// dO of one query and one key tile, the scores and dP in float, P and dS in T.
template <typename T>
struct BackwardTiles {
  T *qs, *ks, *vs, *dos;
  float *ss, *dps;
  T *ps, *dss;
  __device__ BackwardTiles(Carver& carve, const Params& p)
      : qs(carve.take<T>(kTile * p.dp)),
        ks(carve.take<T>(kTile * p.dp)),
        vs(carve.take<T>(kTile * p.dvp)),
        dos(carve.take<T>(kTile * p.dvp)),
        ss(carve.take<float>(kTile * kTile)),
        dps(carve.take<float>(kTile * kTile)),
        ps(carve.take<T>(kTile * kTile)),
        dss(carve.take<T>(kTile * kTile)) {}
};

// For a (query tile i0, key tile j0) pair staged in shared memory: this warp's 16 query rows of
// P (in T) and of dS = P (dP - delta) scale (in T), from S = Q K^T and dP = dO V^T.
template <typename T>
__device__ void probabilities_and_score_grads(const Params& p, int64_t b, int64_t i0, int64_t j0,
                                              const BackwardTiles<T>& t, const float* lse, const float* delta) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* s_rows = t.ss + warp * kFrag * kTile;
  float* dp_rows = t.dps + warp * kFrag * kTile;
  T* ps = t.ps;
  T* dss = t.dss;
  mma_abt(s_rows, kTile, t.qs + warp * kFrag * p.dp, p.dp, t.ks, p.dp, p.dp, kTile);
  mma_abt(dp_rows, kTile, t.dos + warp * kFrag * p.dvp, p.dvp, t.vs, p.dvp, p.dvp, kTile);
  __syncwarp();
  for (int r = 0; r < kFrag; ++r) {
    const int row = warp * kFrag + r;
    const int64_t gi = i0 + row;
    const bool row_valid = gi < p.tq;
    const float max = row_valid ? lse[2 * (b * p.tq + gi)] : 0.0f;
    const float log_sum = row_valid ? lse[2 * (b * p.tq + gi) + 1] : 0.0f;
    const float d = row_valid ? delta[b * p.tq + gi] : 0.0f;
    const int64_t seen = row_valid ? keys_seen(p, gi) : 0;
    for (int c = lane; c < kTile; c += 32) {
      const float prob = j0 + c < seen ? expf((s_rows[r * kTile + c] * p.scale - max) - log_sum) : 0.0f;
      ps[row * kTile + c] = dstore<T>(prob);
      dss[row * kTile + c] = dstore<T>(prob * (dp_rows[r * kTile + c] - d) * p.scale);
    }
  }
}

// The kv kernel's tiles (q, k, v, dO, S, dP, P, dS, dK and dV); the q kernel's lack dV's.
size_t backward_smem(const Params& p, size_t elem, bool with_dv) {
  return piece(kTile * p.dp * elem) * 2 + piece(kTile * p.dvp * elem) * 2 + piece(kTile * kTile * 4) * 2 +
         piece(kTile * kTile * elem) * 2 + piece(kTile * p.dp * 4) + (with_dv ? piece(kTile * p.dvp * 4) : 0);
}

// One block per (key tile, batch entry): dK and dV of its keys, over every query tile that sees them.
template <typename T>
__global__ void __launch_bounds__(kBlock) flash_backward_kv_kernel(const T* q, const T* k, const T* v, const T* dout,
                                                                   const float* lse, const float* delta, T* dk, T* dv,
                                                                   Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  Carver carve{smem};
  const BackwardTiles<T> t(carve, p);
  float* dk_acc = carve.take<float>(kTile * p.dp);
  float* dv_acc = carve.take<float>(kTile * p.dvp);

  const int64_t b = blockIdx.y, j0 = int64_t{blockIdx.x} * kTile;
  const int warp = threadIdx.x / 32;
  load_tile(t.ks, k, p.k, b, j0, p.tk, p.d, p.dp);
  load_tile(t.vs, v, p.v, b, j0, p.tk, p.dv, p.dvp);
  for (int idx = threadIdx.x; idx < kTile * p.dp; idx += blockDim.x) dk_acc[idx] = 0.0f;
  for (int idx = threadIdx.x; idx < kTile * p.dvp; idx += blockDim.x) dv_acc[idx] = 0.0f;
  // Causal: query rows before j0 see none of these keys.
  for (int64_t i0 = p.causal ? j0 : 0; i0 < p.tq; i0 += kTile) {
    __syncthreads();  // the previous query tile is no longer read
    load_tile(t.qs, q, p.q, b, i0, p.tq, p.d, p.dp);
    load_tile(t.dos, dout, p.out, b, i0, p.tq, p.dv, p.dvp);
    __syncthreads();
    probabilities_and_score_grads(p, b, i0, j0, t, lse, delta);
    __syncthreads();  // dV and dK take every warp's rows of P and dS
    // This warp's 16 keys: dV += P^T dO, dK += dS^T Q.
    mma_ab_acc<true>(dv_acc + warp * kFrag * p.dvp, p.dvp, t.ps + warp * kFrag, kTile, t.dos, p.dvp, kTile, p.dvp);
    mma_ab_acc<true>(dk_acc + warp * kFrag * p.dp, p.dp, t.dss + warp * kFrag, kTile, t.qs, p.dp, kTile, p.dp);
  }
  __syncthreads();
  store_tile(dk, dk_acc, p.k, b, j0, p.tk, p.d, p.dp);
  store_tile(dv, dv_acc, p.v, b, j0, p.tk, p.dv, p.dvp);
}

// One block per (query tile, batch entry): dQ = sum over key tiles of dS K.
template <typename T>
__global__ void __launch_bounds__(kBlock) flash_backward_q_kernel(const T* q, const T* k, const T* v, const T* dout,
                                                                  const float* lse, const float* delta, T* dq,
                                                                  Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  Carver carve{smem};
  const BackwardTiles<T> t(carve, p);
  float* dq_acc = carve.take<float>(kTile * p.dp);

  const int64_t b = blockIdx.y, i0 = int64_t{blockIdx.x} * kTile;
  const int warp = threadIdx.x / 32;
  load_tile(t.qs, q, p.q, b, i0, p.tq, p.d, p.dp);
  load_tile(t.dos, dout, p.out, b, i0, p.tq, p.dv, p.dvp);
  for (int idx = threadIdx.x; idx < kTile * p.dp; idx += blockDim.x) dq_acc[idx] = 0.0f;
  const int64_t keys = keys_seen(p, i0 + kTile - 1);
  for (int64_t j0 = 0; j0 < keys; j0 += kTile) {
    __syncthreads();
    load_tile(t.ks, k, p.k, b, j0, p.tk, p.d, p.dp);
    load_tile(t.vs, v, p.v, b, j0, p.tk, p.dv, p.dvp);
    __syncthreads();
    probabilities_and_score_grads(p, b, i0, j0, t, lse, delta);
    __syncwarp();  // this warp's rows of dS only
    mma_ab_acc<false>(dq_acc + warp * kFrag * p.dp, p.dp, t.dss + warp * kFrag * kTile, kTile, t.ks, p.dp, kTile, p.dp);
  }
  __syncthreads();
  store_tile(dq, dq_acc, p.q, b, i0, p.tq, p.d, p.dp);
}

Params params_of(const AttentionShape& s) {
  AG_CHECK(s.d <= kMaxFusedHeadSize && s.dv <= kMaxFusedHeadSize, "flash_attention (CUDA): head sizes ", s.d, " and ",
           s.dv, " must be at most ", kMaxFusedHeadSize);
  AG_CHECK(s.batch >= 1 && s.batch <= 65535, "flash_attention (CUDA): ", s.batch,
           " batch entries (B x H) must be in [1, 65535], the grid's y limit");
  return {.tq = s.tq,
          .tk = s.tk,
          .d = static_cast<int>(s.d),
          .dv = static_cast<int>(s.dv),
          .dp = round_up16(static_cast<int>(s.d)),
          .dvp = round_up16(static_cast<int>(s.dv)),
          .causal = s.causal,
          .scale = static_cast<float>(s.scale),
          .q = s.q,
          .k = s.k,
          .v = s.v,
          .out = s.out};
}

unsigned tiles(int64_t rows) { return static_cast<unsigned>((rows + kTile - 1) / kTile); }

// Launches `kernel` with `smem` bytes of dynamic shared memory (over the default 48 KiB on request).
template <typename Kernel, typename... Args>
void launch(Kernel kernel, dim3 grid, size_t smem, const char* name, Args... args) {
  AG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<grid, kBlock, smem>>>(args...);
  AG_CUDA_CHECK_LAUNCH(name);
}

// The 16-bit dtypes only: float32 attention on CUDA is composed (cuBLAS).
template <typename Fn>
void visit_half_dtype(DType dtype, Fn&& fn) {
  if (dtype == DType::kFloat16) return fn(__half{});
  if (dtype == DType::kBFloat16) return fn(__nv_bfloat16{});
  AG_FAIL("flash_attention (CUDA): float16 or bfloat16 only, got ", dtype_name(dtype));
}

}  // namespace

void flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionShape& shape, Tensor& out,
                     Tensor& lse) {
  const Params p = params_of(shape);
  visit_half_dtype(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch(flash_forward_kernel<T>, dim3(tiles(p.tq), static_cast<unsigned>(shape.batch)), forward_smem(p, sizeof(T)),
           "flash_forward_kernel", static_cast<const T*>(q.data_ptr()), static_cast<const T*>(k.data_ptr()),
           static_cast<const T*>(v.data_ptr()), static_cast<T*>(out.data_ptr()), static_cast<float*>(lse.data_ptr()), p);
  });
}

void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& dout, const AttentionShape& shape, Tensor& dq, Tensor& dk, Tensor& dv) {
  const Params p = params_of(shape);
  Tensor delta = Tensor::empty({shape.batch, shape.tq}, DType::kFloat32, Device::kCUDA);
  visit_half_dtype(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const auto* qp = static_cast<const T*>(q.data_ptr());
    const auto* kp = static_cast<const T*>(k.data_ptr());
    const auto* vp = static_cast<const T*>(v.data_ptr());
    const auto* gp = static_cast<const T*>(dout.data_ptr());
    const auto* lp = static_cast<const float*>(lse.data_ptr());
    auto* delta_p = static_cast<float*>(delta.data_ptr());
    const int64_t rows = shape.batch * shape.tq;
    delta_kernel<T><<<static_cast<unsigned>((rows * 32 + kThreads - 1) / kThreads), kThreads>>>(
        static_cast<const T*>(out.data_ptr()), gp, rows, p, delta_p);
    AG_CUDA_CHECK_LAUNCH("delta_kernel");
    launch(flash_backward_kv_kernel<T>, dim3(tiles(p.tk), static_cast<unsigned>(shape.batch)),
           backward_smem(p, sizeof(T), /*with_dv=*/true),
           "flash_backward_kv_kernel", qp, kp, vp, gp, lp, static_cast<const float*>(delta_p),
           static_cast<T*>(dk.data_ptr()), static_cast<T*>(dv.data_ptr()), p);
    launch(flash_backward_q_kernel<T>, dim3(tiles(p.tq), static_cast<unsigned>(shape.batch)),
           backward_smem(p, sizeof(T), /*with_dv=*/false),
           "flash_backward_q_kernel", qp, kp, vp, gp, lp, static_cast<const float*>(delta_p),
           static_cast<T*>(dq.data_ptr()), p);
  });
}

}  // namespace ampgrad::kernels::cuda
