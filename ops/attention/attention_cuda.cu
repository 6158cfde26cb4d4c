// Fused attention on CUDA for float16 and bfloat16: the FlashAttention-2 algorithm on tensor cores,
// written with the warp-level PTX instruction mma.sync.m16n8k16 (16-bit inputs, float32
// accumulators) so that scores, probabilities and output accumulators stay in registers.
//
//   forward: one block of 4 warps per (64-row query tile, batch entry); each warp owns 16 query
//     rows and keeps their Q fragments, scores S, softmax state and output O in registers. Key and
//     value tiles of 64 rows are staged in shared memory, double-buffered (cp.async when 16-byte
//     aligned). Per key tile: S = Q K^T; the online softmax in float32 (running max m, sum l, O
//     rescaled by exp(m_old - m_new)); O += P V with P rounded to the inputs' dtype (as
//     FlashAttention's). Then O / l, and lse = (m, log l) per row.
//   backward: delta = rowsum(dO * O); one block per key tile writes dK and dV (each warp owns 16
//     keys and computes S^T = K Q^T, so P^T and dS^T are already the A operands of dV += P^T dO and
//     dK += dS^T Q), one block per query tile writes dQ += dS K; both recompute P from the forward's
//     (m, log l): no atomics, so the gradients are deterministic. P and dS are rounded to the
//     inputs' dtype before their products, as FlashAttention's are; the CPU keeps them in float32.
// Head sizes are padded with zeros to a compiled size (32, 64 or 128), so any D, Dv <= 128 runs.
//
// Fragment layouts of mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"), for lane l of
// the warp, g = l / 4, t = l % 4; a .b32 register holds two 16-bit values, the lower-indexed one in
// the low half:
//   A (16x16, row-major): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..2t+1], a2 = A[g][2t+8..2t+9],
//                         a3 = A[g+8][2t+8..2t+9]
//   B (16x8, k x n):      b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//   C (16x8, float32):    c0, c1 = C[g][2t], C[g][2t+1]; c2, c3 = C[g+8][2t], C[g+8][2t+1]
// So the C fragments of two adjacent n8 tiles of S are, rounded and packed in pairs, exactly the A
// fragment of P for one k16 step of P V (FlashAttention-2's register reuse). ldmatrix.x4 loads four
// 8x8 matrices whose rows (16 bytes each) lanes 8i..8i+7 address; lane l receives element pair
// (l / 4, 2t..2t+1) of each, or with .trans pair (2t..2t+1, l / 4): the first is an A fragment or
// the B fragment of a matrix stored [n][k] (K for Q K^T), the second the B fragment of one stored
// [k][n] (V for P V).
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "framework/cuda_check.h"
#include "framework/cuda_helpers.h"
#include "framework/device_cuda.h"
#include "framework/error.h"
#include "ops/attention/attention_kernels.h"

namespace ampgrad::kernels::cuda {

namespace {

using namespace ::ampgrad::cuda;  // the device helpers of framework/cuda_helpers.h

constexpr int kTile = 64;  // query rows of a forward or dQ block, keys of a key tile
constexpr int kWarps = 4;  // each owns 16 rows (queries, or keys in the dK/dV kernel) of a tile
constexpr int kBlock = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kInf = std::numeric_limits<float>::infinity();

struct Params {
  int64_t tq, tk;
  int d, dv;  // head sizes (the kernels pad them with zeros to their compiled size)
  bool causal;
  float scale;
  // Every row of every operand starts 16 bytes aligned and D, Dv are multiples of 8: tiles load
  // with 16-byte cp.async and outputs store in pairs; otherwise 2-byte loads and stores.
  bool aligned;
  RowLayout q, k, v, out;  // where each operand's rows lie (dq, dk, dv as q, k, v; dO as out)
};

// The keys query row `row` sees: all, or (causal, top-left aligned) those up to its own index.
__device__ int64_t keys_seen(const Params& p, int64_t row) {
  return p.causal ? (row + 1 < p.tk ? row + 1 : p.tk) : p.tk;
}
__device__ bool sees(const Params& p, int64_t row, int64_t key) { return key < keys_seen(p, row); }

// ---- PTX primitives ----

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// d += a b for one 16x8x16 tile, float32 accumulators (layouts above).
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Four 8x8 matrices of 16-bit values from shared memory; `row` is this lane's row address (above).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row))
               : "memory");
}

// kBytes (4, 8 or 16) from global to shared memory, asynchronously; !valid writes zeros instead
// (src must still be a valid address). Complete after cp_async_wait.
template <int kBytes>
__device__ __forceinline__ void cp_async(void* dst, const void* src, bool valid) {
  const int src_bytes = valid ? kBytes : 0;
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
                 "r"(src_bytes)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(shared_address(dst)), "l"(src),
                 "n"(kBytes), "r"(src_bytes)
                 : "memory");
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Two floats rounded to T and packed, `lo` in the low half: one operand register.
template <typename T>
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  uint32_t bits;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    std::memcpy(&bits, &h, sizeof bits);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    std::memcpy(&bits, &h, sizeof bits);
  }
  return bits;
}

// ---- warp tiles ----
// Shared tiles are row-major with a row stride of kHead + 8 elements: 16 bytes of padding put the
// 8 rows one ldmatrix reads in 8 different 4-bank groups, so its reads are free of bank conflicts.

template <int kHead>
constexpr int kStride = kHead + 8;

// Rows [row0, row0 + kRows) of an operand (row r at src + r row_stride, `rows` of them, `cols`
// wide) into a [kRows, kStride] shared tile, zero-padded to kHead columns and past `rows`.
// Aligned: 16-byte cp.async copies (complete after cp_async_wait); else 2-byte loads.
template <int kRows, int kHead, typename T>
__device__ void load_tile(T* dst, const T* src, int64_t row_stride, int64_t row0, int64_t rows, int cols,
                          bool aligned) {
  constexpr int kChunks = kHead / 8;  // 16-byte pieces of a tile row
  static_assert(kRows * kChunks % kBlock == 0, "every thread copies the same number of pieces");
#pragma unroll
  for (int it = 0; it < kRows * kChunks / kBlock; ++it) {
    const int idx = it * kBlock + threadIdx.x;
    const int r = idx / kChunks, c = idx % kChunks * 8;
    const int64_t row = row0 + r;
    T* to = dst + r * kStride<kHead> + c;
    if (aligned) {
      const bool valid = row < rows && c < cols;  // cols % 8 == 0: a piece is all in or all out
      cp_async<16>(to, valid ? src + row * row_stride + c : src, valid);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) to[e] = row < rows && c + e < cols ? src[row * row_stride + c + e] : dstore<T>(0.0f);
    }
  }
}

// A fragments of rows [row0, row0 + 16) and all kK columns of a shared tile: lane l addresses row
// row0 + l % 8 + 8 ((l / 8) % 2), column 8 (l / 16) of each k16 step, so the four matrices are
// (rows +0, cols +0) = a0, (+8, +0) = a1, (+0, +8) = a2, (+8, +8) = a3.
template <int kK, typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[kK / 16][4], const T* tile, int ld, int row0) {
  const int lane = threadIdx.x % 32;
  const T* row = tile + (row0 + lane % 8 + (lane / 8 % 2) * 8) * ld + (lane / 16) * 8;
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) ldmatrix_x4(a[kk], row + kk * 16);
}

// This warp's c[16, kN] += A M^T: A as fragments over kK columns, M a shared [kN, kK] tile (the
// keys for Q K^T). For n16 block np, lane l addresses M's row 16 np + l % 8 + 8 (l / 16), column
// 16 kk + 8 ((l / 8) % 2): matrices (n +0, k +0) = b0 and (+0, +8) = b1 of n8 tile 2 np, then
// (+8, +0) and (+8, +8) of tile 2 np + 1, since B[k][n] = M[n][k] (no transpose needed).
template <int kN, int kK, typename T>
__device__ __forceinline__ void mma_abt(float (&c)[kN / 8][4], const uint32_t (&a)[kK / 16][4], const T* m, int ld) {
  const int lane = threadIdx.x % 32;
  const T* row = m + (lane % 8 + (lane / 16) * 8) * ld + (lane / 8 % 2) * 8;
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < kN / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, row + np * 16 * ld + kk * 16);
      mma_16816<T>(c[2 * np], a[kk], b[0], b[1]);
      mma_16816<T>(c[2 * np + 1], a[kk], b[2], b[3]);
    }
  }
}

// This warp's c[16, kN] += P M: P as float C fragments over kK columns (rounded to T here), M a
// shared [kK, kN] tile (the values for P V). The C fragments of n8 tiles 2 kk and 2 kk + 1 are
// P's A fragment of k16 step kk: (c0, c1) of tile 2 kk = P[g][2t..2t+1] = a0, its (c2, c3) = a1,
// and tile 2 kk + 1's = a2, a3. B[k][n] = M[k][n] pairs two rows of one column, so ldmatrix.trans:
// lane l addresses row 16 kk + l % 8 + 8 ((l / 8) % 2), column 16 np + 8 (l / 16): matrices
// (k +0, n +0) = b0 and (+8, +0) = b1 of n8 tile 2 np, then (+0, +8) and (+8, +8) of 2 np + 1.
template <int kN, int kK, typename T>
__device__ __forceinline__ void mma_pv(float (&c)[kN / 8][4], const float (&pc)[kK / 8][4], const T* m, int ld) {
  const int lane = threadIdx.x % 32;
  const T* row = m + (lane % 8 + (lane / 8 % 2) * 8) * ld + (lane / 16) * 8;
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    const uint32_t a[4] = {pack<T>(pc[2 * kk][0], pc[2 * kk][1]), pack<T>(pc[2 * kk][2], pc[2 * kk][3]),
                           pack<T>(pc[2 * kk + 1][0], pc[2 * kk + 1][1]),
                           pack<T>(pc[2 * kk + 1][2], pc[2 * kk + 1][3])};
#pragma unroll
    for (int np = 0; np < kN / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, row + kk * 16 * ld + np * 16);
      mma_16816<T>(c[2 * np], a, b[0], b[1]);
      mma_16816<T>(c[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// Sets the entries of this warp's C fragments c[16, kN] (row0 + g + 8 (e / 2), col0 + 8 n + 2t +
// e % 2) for which keep(row, col) is false to `value`.
template <int kN, typename Keep>
__device__ __forceinline__ void mask(float (&c)[kN / 8][4], int64_t row0, int64_t col0, float value, Keep keep) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (!keep(row0 + lane / 4 + 8 * (e / 2), col0 + 8 * n + 2 * (lane % 4) + e % 2)) c[n][e] = value;
    }
  }
}

// The sum over the 4 lanes of a quad, which hold the columns of the same two rows.
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// e^x as one MUFU.EX2 instruction. x is a difference of scores (s - m), so its rounding is that of
// the scores: scaling by log2(e) before the subtraction would round at the scores' magnitude.
__device__ __forceinline__ float exp_of(float x) { return exp2f(x * kLog2e); }

// One key tile of the online softmax for this thread's rows g and g + 8 (r = 0, 1: entries 2r,
// 2r + 1 of each fragment). s: the scaled scores, hidden ones -inf; becomes p = exp(s - m) for
// the new running max m. row_max: the running max; row_sum: this thread's share of the row's sum
// of p (the quad's shares are added at the end); o: rescaled by exp(m_old - m).
template <int kN, int kHead>
__device__ __forceinline__ void online_softmax(float (&s)[kN / 8][4], float (&row_max)[2], float (&row_sum)[2],
                                               float (&o)[kHead / 8][4]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float m = row_max[r];
#pragma unroll
    for (int n = 0; n < kN / 8; ++n) m = fmaxf(m, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
    m = quad_max(m);
    // A row that has seen no key yet keeps max -inf: subtract 0 then, so its p are 0, not NaN.
    const float ref = m == -kInf ? 0.0f : m;
    const float rescale = exp_of(row_max[r] - ref);  // 0 on the first tile (row_max -inf)
    row_max[r] = m;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
      for (int e = 2 * r; e < 2 * r + 2; ++e) {
        s[n][e] = exp_of(s[n][e] - ref);
        sum += s[n][e];
      }
    }
    row_sum[r] = row_sum[r] * rescale + sum;
#pragma unroll
    for (int n = 0; n < kHead / 8; ++n) {
      o[n][2 * r] *= rescale;
      o[n][2 * r + 1] *= rescale;
    }
  }
}

// Columns col, col + 1 of an output row (`cols` wide), rounded once to T.
template <typename T>
__device__ __forceinline__ void store_pair(T* row, int col, float x, float y, int cols, bool aligned) {
  if (aligned) {  // cols % 8 == 0 and col even: both or neither are in, and 4-byte aligned
    if (col < cols) {
      const T pair[2] = {dstore<T>(x), dstore<T>(y)};
      uint32_t bits;
      std::memcpy(&bits, pair, sizeof bits);
      *reinterpret_cast<uint32_t*>(row + col) = bits;
    }
  } else {
    if (col < cols) row[col] = dstore<T>(x);
    if (col + 1 < cols) row[col + 1] = dstore<T>(y);
  }
}

// This warp's c[16, kHead] (rows row0 + g, row0 + g + 8 of an operand, `rows` of them, `cols`
// wide; row r at dst + r row_stride) times `factor[r]`, rounded once; rows past the end skipped.
template <int kHead, typename T>
__device__ __forceinline__ void store_rows(T* dst, int64_t row_stride, int64_t row0, int64_t rows, int cols,
                                           const float (&c)[kHead / 8][4], const float (&factor)[2], bool aligned) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + lane / 4 + 8 * r;
    if (row >= rows) continue;
#pragma unroll
    for (int n = 0; n < kHead / 8; ++n) {
      store_pair(dst + row * row_stride, 8 * n + 2 * (lane % 4), c[n][2 * r] * factor[r], c[n][2 * r + 1] * factor[r],
                 cols, aligned);
    }
  }
}

// ---- forward ----

// Shared memory: two buffers each of a key and a value tile; the query tile is staged in value
// buffer 1, which tile 1 only fills once every warp holds its query fragments in registers.
template <int kHead>
constexpr size_t kForwardSmem = 4 * kTile * kStride<kHead> * 2;  // 2: bytes of a 16-bit element

// q [batch, Tq, D], k [batch, Tk, D], v [batch, Tk, Dv] where p's layouts put their rows; out
// [batch, Tq, Dv] where p.out does; lse [batch, Tq, 2]. Grid (query tiles, batch).
template <typename T, int kHead>
__global__ void __launch_bounds__(kBlock) flash_forward_kernel(const T* q, const T* k, const T* v, T* out, float* lse,
                                                               Params p) {
  constexpr int kTileElems = kTile * kStride<kHead>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* ks = reinterpret_cast<T*>(smem);  // [2][kTile][kStride]
  T* vs = ks + 2 * kTileElems;         // [2][kTile][kStride]
  T* qs = vs + kTileElems;

  const int64_t b = blockIdx.y;
  const int64_t i0 = int64_t{gridDim.x - 1 - blockIdx.x} * kTile;  // the longest causal rows start first
  const int warp = threadIdx.x / 32;
  const int64_t row0 = i0 + warp * 16;  // this warp's first query row
  const T* qb = q + p.q.at(b, 0);       // row r of batch entry b at qb + r row_stride
  const T* kb = k + p.k.at(b, 0);
  const T* vb = v + p.v.at(b, 0);
  const int64_t last_row = (i0 + kTile < p.tq ? i0 + kTile : p.tq) - 1;
  const int tiles = static_cast<int>((keys_seen(p, last_row) + kTile - 1) / kTile);

  load_tile<kTile, kHead>(qs, qb, p.q.row_stride, i0, p.tq, p.d, p.aligned);
  load_tile<kTile, kHead>(ks, kb, p.k.row_stride, 0, p.tk, p.d, p.aligned);
  load_tile<kTile, kHead>(vs, vb, p.v.row_stride, 0, p.tk, p.dv, p.aligned);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t qf[kHead / 16][4];
  load_a<kHead>(qf, qs, kStride<kHead>, warp * 16);
  __syncthreads();  // qs is value buffer 1, which the first iteration fills with tile 1

  float o[kHead / 8][4] = {};
  float row_max[2] = {-kInf, -kInf}, row_sum[2] = {0.0f, 0.0f};
  for (int tile = 0; tile < tiles; ++tile) {
    const int64_t j0 = int64_t{tile} * kTile;
    const int cur = tile % 2;
    if (tile + 1 < tiles) {  // the next tile's copies overlap this tile's products
      load_tile<kTile, kHead>(ks + (1 - cur) * kTileElems, kb, p.k.row_stride, j0 + kTile, p.tk, p.d, p.aligned);
      load_tile<kTile, kHead>(vs + (1 - cur) * kTileElems, vb, p.v.row_stride, j0 + kTile, p.tk, p.dv, p.aligned);
    }
    cp_async_commit();
    cp_async_wait<1>();  // all but the group just committed: this tile's
    __syncthreads();

    float s[kTile / 8][4] = {};
    mma_abt<kTile, kHead>(s, qf, ks + cur * kTileElems, kStride<kHead>);
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] *= p.scale;
    }
    if (j0 + kTile > p.tk || (p.causal && j0 + kTile - 1 > row0)) {
      mask<kTile>(s, row0, j0, -kInf, [&](int64_t i, int64_t j) { return sees(p, i, j); });
    }
    online_softmax<kTile, kHead>(s, row_max, row_sum, o);
    mma_pv<kHead, kTile>(o, s, vs + cur * kTileElems, kStride<kHead>);
    __syncthreads();  // every warp is done with this buffer before the next iteration refills it
  }

  const int lane = threadIdx.x % 32;
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] = quad_sum(row_sum[r]);
    inv[r] = 1.0f / row_sum[r];
  }
  store_rows<kHead>(out + p.out.at(b, 0), p.out.row_stride, row0, p.tq, p.dv, o, inv, p.aligned);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + lane / 4 + 8 * r;
    if (lane % 4 == 0 && row < p.tq) {
      lse[2 * (b * p.tq + row)] = row_max[r];
      lse[2 * (b * p.tq + row) + 1] = logf(row_sum[r]);
    }
  }
}

// ---- backward ----

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
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

// Query rows per step of the dK/dV kernel: 32 at head size 128, so that dK, dV (128 registers)
// and the step's S^T, dP^T (32) fit in a thread's 255 registers.
template <int kHead>
constexpr int kKvStepRows = kHead <= 64 ? 64 : 32;

// Shared memory: the key and value tiles, then two buffers each of a query and an output-gradient
// step and of its rows' (max, log_sum) pairs and deltas.
template <int kHead>
constexpr size_t kBackwardKvSmem = (2 * kTile + 4 * kKvStepRows<kHead>) * kStride<kHead> * 2 +
                                   2 * kKvStepRows<kHead> * 3 * sizeof(float);

// One block per (key tile, batch entry): dK and dV of its keys, over every query step that sees
// them. Warp w owns keys j0 + 16w .. + 16: S^T = K Q^T and dP^T = V dO^T are [16 keys, step rows].
// q, k, v, dout as the forward's q, k, v, out; lse [batch, Tq, 2], delta [batch, Tq]; dk, dv
// where p.k, p.v put k's and v's rows. Grid (key tiles, batch).
template <typename T, int kHead>
__global__ void __launch_bounds__(kBlock) flash_backward_kv_kernel(const T* q, const T* k, const T* v, const T* dout,
                                                                   const float* lse, const float* delta, T* dk, T* dv,
                                                                   Params p) {
  constexpr int kRows = kKvStepRows<kHead>;
  constexpr int kLd = kStride<kHead>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* ks = reinterpret_cast<T*>(smem);  // [kTile][kLd]
  T* vs = ks + kTile * kLd;            // [kTile][kLd]
  T* qs = vs + kTile * kLd;            // [2][kRows][kLd]
  T* dos = qs + 2 * kRows * kLd;       // [2][kRows][kLd]
  auto* stats = reinterpret_cast<float2*>(dos + 2 * kRows * kLd);  // [2][kRows]: (max, log_sum)
  auto* deltas = reinterpret_cast<float*>(stats + 2 * kRows);      // [2][kRows]

  const int64_t b = blockIdx.y, j0 = int64_t{blockIdx.x} * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t key0 = j0 + warp * 16;  // this warp's first key
  const T* qb = q + p.q.at(b, 0);
  const T* gb = dout + p.out.at(b, 0);
  const float2* lse_b = reinterpret_cast<const float2*>(lse) + b * p.tq;  // lse is [batch, Tq, 2]
  const float* delta_b = delta + b * p.tq;
  const int64_t first = p.causal ? j0 : 0;  // causal: earlier query rows see none of these keys
  const int steps = first < p.tq ? static_cast<int>((p.tq - first + kRows - 1) / kRows) : 0;

  // Step `step`'s query rows, their output gradients and statistics into buffer `buf`.
  auto load_step = [&](int step, int buf) {
    const int64_t i0 = first + int64_t{step} * kRows;
    load_tile<kRows, kHead>(qs + buf * kRows * kLd, qb, p.q.row_stride, i0, p.tq, p.d, p.aligned);
    load_tile<kRows, kHead>(dos + buf * kRows * kLd, gb, p.out.row_stride, i0, p.tq, p.dv, p.aligned);
    for (int r = threadIdx.x; r < kRows; r += kBlock) {
      const bool valid = i0 + r < p.tq;  // rows past Tq get zeros (and are masked below)
      cp_async<8>(stats + buf * kRows + r, lse_b + (valid ? i0 + r : 0), valid);
      cp_async<4>(deltas + buf * kRows + r, delta_b + (valid ? i0 + r : 0), valid);
    }
  };

  load_tile<kTile, kHead>(ks, k + p.k.at(b, 0), p.k.row_stride, j0, p.tk, p.d, p.aligned);
  load_tile<kTile, kHead>(vs, v + p.v.at(b, 0), p.v.row_stride, j0, p.tk, p.dv, p.aligned);
  if (steps > 0) load_step(0, 0);
  cp_async_commit();

  float dk_acc[kHead / 8][4] = {}, dv_acc[kHead / 8][4] = {};
  for (int step = 0; step < steps; ++step) {
    const int64_t i0 = first + int64_t{step} * kRows;
    const int cur = step % 2;
    if (step + 1 < steps) load_step(step + 1, 1 - cur);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const T* qt = qs + cur * kRows * kLd;
    const T* dot = dos + cur * kRows * kLd;

    float st[kRows / 8][4] = {}, dpt[kRows / 8][4] = {};  // S^T and dP^T: rows keys, columns queries
    {
      uint32_t a[kHead / 16][4];
      load_a<kHead>(a, ks, kLd, warp * 16);
      mma_abt<kRows, kHead>(st, a, qt, kLd);
      load_a<kHead>(a, vs, kLd, warp * 16);
      mma_abt<kRows, kHead>(dpt, a, dot, kLd);
    }
    // P^T = exp((s scale - m) - log_sum) and dS^T = P^T (dP^T - delta) scale; entry e of n8 tile
    // n is key g + 8 (e / 2), query 8n + 2t + e % 2, so a lane needs two queries' statistics.
#pragma unroll
    for (int n = 0; n < kRows / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = 8 * n + 2 * (lane % 4) + e;
        const float2 ml = stats[cur * kRows + col];
        const float d = deltas[cur * kRows + col];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float prob = exp_of((st[n][2 * r + e] * p.scale - ml.x) - ml.y);
          dpt[n][2 * r + e] = prob * (dpt[n][2 * r + e] - d) * p.scale;
          st[n][2 * r + e] = prob;
        }
      }
    }
    // Hidden pairs, and query rows past Tq (their zero scores would give p = 1), contribute 0.
    if (i0 + kRows > p.tq || key0 + 16 > p.tk || (p.causal && key0 + 15 > i0)) {
      const auto seen = [&](int64_t j, int64_t i) { return i < p.tq && sees(p, i, j); };
      mask<kRows>(st, key0, i0, 0.0f, seen);
      mask<kRows>(dpt, key0, i0, 0.0f, seen);
    }
    mma_pv<kHead, kRows>(dv_acc, st, dot, kLd);  // dV += P^T dO
    mma_pv<kHead, kRows>(dk_acc, dpt, qt, kLd);  // dK += dS^T Q
    __syncthreads();  // every warp is done with this buffer before the next iteration refills it
  }
  cp_async_wait<0>();  // with no step, the key and value copies are still in flight

  const float one[2] = {1.0f, 1.0f};
  store_rows<kHead>(dk + p.k.at(b, 0), p.k.row_stride, key0, p.tk, p.d, dk_acc, one, p.aligned);
  store_rows<kHead>(dv + p.v.at(b, 0), p.v.row_stride, key0, p.tk, p.dv, dv_acc, one, p.aligned);
}

// Shared memory: the query and output-gradient tiles, then two buffers each of a key and a value tile.
template <int kHead>
constexpr size_t kBackwardQSmem = 6 * kTile * kStride<kHead> * 2;

// One block per (query tile, batch entry): dQ = sum over key tiles of dS K. Warp w owns query rows
// i0 + 16w .. + 16: S = Q K^T and dP = dO V^T are [16 queries, 64 keys]. Operands as the dK/dV
// kernel's; dq where p.q puts q's rows. Grid (query tiles, batch).
template <typename T, int kHead>
__global__ void __launch_bounds__(kBlock) flash_backward_q_kernel(const T* q, const T* k, const T* v, const T* dout,
                                                                  const float* lse, const float* delta, T* dq,
                                                                  Params p) {
  constexpr int kLd = kStride<kHead>;
  constexpr int kTileElems = kTile * kLd;
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);  // [kTile][kLd]
  T* dos = qs + kTileElems;            // [kTile][kLd]
  T* ks = dos + kTileElems;            // [2][kTile][kLd]
  T* vs = ks + 2 * kTileElems;         // [2][kTile][kLd]

  const int64_t b = blockIdx.y;
  const int64_t i0 = int64_t{gridDim.x - 1 - blockIdx.x} * kTile;  // the longest causal rows start first
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row0 = i0 + warp * 16;
  const T* kb = k + p.k.at(b, 0);
  const T* vb = v + p.v.at(b, 0);
  const int64_t last_row = (i0 + kTile < p.tq ? i0 + kTile : p.tq) - 1;
  const int tiles = static_cast<int>((keys_seen(p, last_row) + kTile - 1) / kTile);

  load_tile<kTile, kHead>(qs, q + p.q.at(b, 0), p.q.row_stride, i0, p.tq, p.d, p.aligned);
  load_tile<kTile, kHead>(dos, dout + p.out.at(b, 0), p.out.row_stride, i0, p.tq, p.dv, p.aligned);
  load_tile<kTile, kHead>(ks, kb, p.k.row_stride, 0, p.tk, p.d, p.aligned);
  load_tile<kTile, kHead>(vs, vb, p.v.row_stride, 0, p.tk, p.dv, p.aligned);
  cp_async_commit();

  // This thread's rows g and g + 8: the forward's (max, log_sum), and delta.
  float row_max[2], row_log_sum[2], row_delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + lane / 4 + 8 * r;
    const bool valid = row < p.tq;
    row_max[r] = valid ? lse[2 * (b * p.tq + row)] : 0.0f;
    row_log_sum[r] = valid ? lse[2 * (b * p.tq + row) + 1] : 0.0f;
    row_delta[r] = valid ? delta[b * p.tq + row] : 0.0f;
  }

  float dq_acc[kHead / 8][4] = {};
  for (int tile = 0; tile < tiles; ++tile) {
    const int64_t j0 = int64_t{tile} * kTile;
    const int cur = tile % 2;
    if (tile + 1 < tiles) {
      load_tile<kTile, kHead>(ks + (1 - cur) * kTileElems, kb, p.k.row_stride, j0 + kTile, p.tk, p.d, p.aligned);
      load_tile<kTile, kHead>(vs + (1 - cur) * kTileElems, vb, p.v.row_stride, j0 + kTile, p.tk, p.dv, p.aligned);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const T* kt = ks + cur * kTileElems;

    float s[kTile / 8][4] = {}, ds[kTile / 8][4] = {};
    {
      uint32_t a[kHead / 16][4];
      load_a<kHead>(a, qs, kLd, warp * 16);
      mma_abt<kTile, kHead>(s, a, kt, kLd);
      load_a<kHead>(a, dos, kLd, warp * 16);
      mma_abt<kTile, kHead>(ds, a, vs + cur * kTileElems, kLd);  // dP, turned into dS below
    }
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        const float prob = exp_of((s[n][e] * p.scale - row_max[r]) - row_log_sum[r]);
        ds[n][e] = prob * (ds[n][e] - row_delta[r]) * p.scale;
      }
    }
    if (row0 + 16 > p.tq || j0 + kTile > p.tk || (p.causal && j0 + kTile - 1 > row0)) {
      mask<kTile>(ds, row0, j0, 0.0f, [&](int64_t i, int64_t j) { return i < p.tq && sees(p, i, j); });
    }
    mma_pv<kHead, kTile>(dq_acc, ds, kt, kLd);  // dQ += dS K
    __syncthreads();
  }

  const float one[2] = {1.0f, 1.0f};
  store_rows<kHead>(dq + p.q.at(b, 0), p.q.row_stride, row0, p.tq, p.d, dq_acc, one, p.aligned);
}

// ---- host side ----

// Whether every row of an operand (`cols` wide, rows where `layout` puts them in data) starts
// 16 bytes aligned and holds whole 16-byte pieces.
bool rows_aligned(const void* data, const RowLayout& layout, int64_t cols) {
  return reinterpret_cast<uintptr_t>(data) % 16 == 0 && layout.offset % 8 == 0 && layout.sequence_stride % 8 == 0 &&
         layout.head_stride % 8 == 0 && layout.row_stride % 8 == 0 && cols % 8 == 0;
}

Params params_of(const AttentionShape& s) {
  AG_CHECK(s.d <= kMaxFusedHeadSize && s.dv <= kMaxFusedHeadSize, "flash_attention (CUDA): head sizes ", s.d, " and ",
           s.dv, " must be at most ", kMaxFusedHeadSize);
  AG_CHECK(s.batch >= 1 && s.batch <= 65535, "flash_attention (CUDA): ", s.batch,
           " batch entries (B x H) must be in [1, 65535], the grid's y limit");
  AG_CHECK(s.dropout_p == 0, "flash_attention (CUDA): dropout runs the composed path");
  return {.tq = s.tq,
          .tk = s.tk,
          .d = static_cast<int>(s.d),
          .dv = static_cast<int>(s.dv),
          .causal = s.causal,
          .scale = static_cast<float>(s.scale),
          .aligned = false,
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

// The compiled head size the larger of D and Dv pads to: 32, 64 or 128.
template <typename Fn>
void visit_head_size(const Params& p, Fn&& fn) {
  const int head = p.d > p.dv ? p.d : p.dv;
  if (head <= 32) return fn(std::integral_constant<int, 32>{});
  if (head <= 64) return fn(std::integral_constant<int, 64>{});
  return fn(std::integral_constant<int, 128>{});
}

}  // namespace

void flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionShape& shape, Tensor& out,
                     Tensor& lse) {
  Params p = params_of(shape);
  p.aligned = rows_aligned(q.data_ptr(), p.q, p.d) && rows_aligned(k.data_ptr(), p.k, p.d) &&
              rows_aligned(v.data_ptr(), p.v, p.dv) && rows_aligned(out.data_ptr(), p.out, p.dv);
  visit_half_dtype(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    visit_head_size(p, [&](auto head) {
      constexpr int kHead = decltype(head)::value;
      launch(flash_forward_kernel<T, kHead>, dim3(tiles(p.tq), static_cast<unsigned>(shape.batch)),
             kForwardSmem<kHead>, "flash_forward_kernel", static_cast<const T*>(q.data_ptr()),
             static_cast<const T*>(k.data_ptr()), static_cast<const T*>(v.data_ptr()), static_cast<T*>(out.data_ptr()),
             static_cast<float*>(lse.data_ptr()), p);
    });
  });
}

void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& dout, const AttentionShape& shape, Tensor& dq, Tensor& dk, Tensor& dv) {
  Params p = params_of(shape);
  p.aligned = rows_aligned(q.data_ptr(), p.q, p.d) && rows_aligned(k.data_ptr(), p.k, p.d) &&
              rows_aligned(v.data_ptr(), p.v, p.dv) && rows_aligned(dout.data_ptr(), p.out, p.dv) &&
              rows_aligned(dq.data_ptr(), p.q, p.d) && rows_aligned(dk.data_ptr(), p.k, p.d) &&
              rows_aligned(dv.data_ptr(), p.v, p.dv);
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
    visit_head_size(p, [&](auto head) {
      constexpr int kHead = decltype(head)::value;
      launch(flash_backward_kv_kernel<T, kHead>, dim3(tiles(p.tk), static_cast<unsigned>(shape.batch)),
             kBackwardKvSmem<kHead>, "flash_backward_kv_kernel", qp, kp, vp, gp, lp,
             static_cast<const float*>(delta_p), static_cast<T*>(dk.data_ptr()), static_cast<T*>(dv.data_ptr()), p);
      launch(flash_backward_q_kernel<T, kHead>, dim3(tiles(p.tq), static_cast<unsigned>(shape.batch)),
             kBackwardQSmem<kHead>, "flash_backward_q_kernel", qp, kp, vp, gp, lp, static_cast<const float*>(delta_p),
             static_cast<T*>(dq.data_ptr()), p);
    });
  });
}

}  // namespace ampgrad::kernels::cuda
