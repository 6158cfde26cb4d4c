// The FP8 GEMM on CUDA (cuda::gemm_float8, linear_float8_kernels.h): cuBLASLt's FP8 matmul with
// FP32 accumulation and a float32 result on GPUs with FP8 tensor cores (compute capability 8.9+),
// else the FP8 operands decoded to bfloat16 (every FP8 value is a bfloat16 value) and the cuBLAS
// GEMM with a float32 result. Either way each product of two FP8 values is exact in FP32, so the
// result is an FP32 GEMM of the operands' values up to the order of the sums (and, on FP8 tensor
// cores, the narrower adds between promotions to FP32: about 14 bits on Hopper).
//
// Hopper's FP8 matmul takes only the "TN" layout: both operands with K contiguous. The FP8 linear's
// operands arrive so: the forward (x w^T) already is, and for the backward's dx = dy w and
// dw = dy^T x the casts of w, x and dy write w^T, x^T and dy^T in the same pass
// (quantize_float8_pair, Transformer Engine's fused cast+transpose; the forward saves the twins in
// place of x and w). An operand in the other layout, from any other caller of gemm with FP8
// operands (the kernel contract stays gemm's: any op(a), op(b)), is made K-contiguous here by a
// byte transpose: one more pass of one byte an element, little beside the GEMM's 2 m n k operations.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include "framework/cuda_check.h"
#include "framework/cuda_helpers.h"
#include "ops/linear/cublaslt.h"
#include "ops/linear/linear_float8_kernels.h"

namespace ampgrad::kernels::cuda {

namespace {

using namespace ::ampgrad::cuda;  // the device helpers of framework/cuda_helpers.h

// cuBLASLt's scratch space: what its heuristics want for large FP8 GEMMs (Transformer Engine gives
// 32 MiB on Hopper). From the caching allocator, so repeated GEMMs reuse one block.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int kTile = 32;

// in is (rows, cols) row-major, out (cols, rows); col_tiles = ceil(cols / 32). One 32x32 tile a
// block, staged in shared memory so that both the reads and the writes are coalesced (the +1
// column avoids bank conflicts).
__global__ void transpose_bytes_kernel(const uint8_t* in, int64_t rows, int64_t cols, int64_t col_tiles,
                                       uint8_t* out) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  const int64_t r0 = (blockIdx.x / col_tiles) * kTile, c0 = (blockIdx.x % col_tiles) * kTile;
  for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = in[r * cols + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) out[c * rows + r] = tile[threadIdx.x][i];
  }
}

// t^T as a new (cols, rows) tensor of t's 8-bit dtype.
Tensor transposed(const Tensor& t) {
  const int64_t rows = t.size(0), cols = t.size(1);
  Tensor out = Tensor::empty({cols, rows}, t.dtype(), Device::kCUDA);
  const int64_t col_tiles = (cols + kTile - 1) / kTile, tiles = (rows + kTile - 1) / kTile * col_tiles;
  AG_CHECK(tiles <= std::numeric_limits<int>::max(), "gemm_float8 (CUDA): a ", rows, "x", cols,
           " operand is too large to transpose in one launch");
  transpose_bytes_kernel<<<static_cast<unsigned>(tiles), dim3(kTile, 8)>>>(
      static_cast<const uint8_t*>(t.data_ptr()), rows, cols, col_tiles, static_cast<uint8_t*>(out.data_ptr()));
  AG_CUDA_CHECK_LAUNCH("fp8 transpose");
  return out;
}

// FP8 GEMMs run on cuBLASLt's FP8 matmul, process-wide (float8_tensor_core_gemms_for_testing).
std::atomic<int64_t> tensor_core_gemms{0};

}  // namespace

// Says once on stderr when the GPU has none.
bool has_float8_tensor_cores() {
  int device = 0;
  AG_CUDA_CHECK(cudaGetDevice(&device));
  // Asked once per device and thread: three driver calls on every GEMM would add up.
  thread_local std::map<int, bool> known;
  if (const auto it = known.find(device); it != known.end()) return it->second;
  int major = 0, minor = 0;
  AG_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  AG_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  const bool has = major * 10 + minor >= 89;
  known[device] = has;
  if (has) return true;
  static std::once_flag told;
  std::call_once(told, [&] {
    std::fprintf(stderr,
                 "ampgrad: this GPU (compute capability %d.%d) has no FP8 tensor cores (8.9 and newer do): FP8 "
                 "GEMMs multiply their FP8 values as bfloat16 (the same products, at BF16 speed)\n",
                 major, minor);
  });
  return false;
}

int64_t float8_tensor_core_gemms_for_testing() { return tensor_core_gemms.load(); }

namespace {

// What cuBLASLt's FP8 matmul accepts (its documented requirements): single 2-D products, not two
// E5M2 operands, 16-byte aligned pointers and dimensions that are multiples of 16 (so every
// leading dimension is a multiple of 16 bytes, for the float32 output too). Pointers are asked to
// be 256-byte aligned, what the heuristics assume unless told otherwise (fresh tensors from the
// caching allocator are); an operand in the other layout is checked as its fresh transposed copy
// will be, so only its size matters. A bias is left to the fallback: the FP8 linear adds its bias
// in descale.
bool lt_accepts(const Tensor& a, bool a_copied, const Tensor& b, bool b_copied, const Tensor& bias,
                const Tensor& out, int64_t m, int64_t n, int64_t k) {
  const auto aligned = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 256 == 0; };
  return a.dim() == 2 && b.dim() == 2 && out.dim() == 2 && !bias.defined() && m > 0 && n > 0 && k > 0 &&
         m % 16 == 0 && n % 16 == 0 && k % 16 == 0 &&
         !(a.dtype() == DType::kFloat8E5M2 && b.dtype() == DType::kFloat8E5M2) && (a_copied || aligned(a)) &&
         (b_copied || aligned(b)) && aligned(out);
}

cudaDataType_t lt_type(DType dtype) { return dtype == DType::kFloat8E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

// The descriptors of one matmul, destroyed however it ends.
struct LtDescriptors {
  cublasLtMatmulDesc_t matmul = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, result = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  ~LtDescriptors() {
    const CublasLtApi& lt = cublaslt();
    if (preference != nullptr) lt.preference_destroy(preference);
    if (result != nullptr) lt.matrix_layout_destroy(result);
    if (second != nullptr) lt.matrix_layout_destroy(second);
    if (first != nullptr) lt.matrix_layout_destroy(first);
    if (matmul != nullptr) lt.matmul_desc_destroy(matmul);
  }
};

// out[m, n] = a[m, k] b[n, k]^T (row-major, K contiguous in both) on FP8 tensor cores. Returns
// false, having done nothing, when cuBLASLt's heuristics offer no algorithm for the problem.
// Row-major trick as in linear_cuda.cu: the row-major out is the column-major out^T[n, m] =
// b^T a, i.e. cuBLASLt's A = b transposed (k x n stored, "T") and B = a not transposed (k x m
// stored, "N"): the TN layout, ld = k for both and n for the result.
bool lt_matmul(const Tensor& a, const Tensor& b, Tensor& out, int64_t m, int64_t n, int64_t k) {
  const CublasLtApi& lt = cublaslt();
  LtDescriptors d;
  AG_CUBLASLT_CHECK(lt.matmul_desc_create(&d.matmul, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  AG_CUBLASLT_CHECK(lt.matmul_desc_set_attribute(d.matmul, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa));
  AG_CUBLASLT_CHECK(lt.matmul_desc_set_attribute(d.matmul, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb));
  // No fast accumulation: with it Hopper keeps the running sums in the tensor cores' narrower
  // accumulator for the whole K; without it cuBLASLt promotes them to FP32 as it goes (Transformer
  // Engine's split accumulator), which the "FP32 accumulation" contract needs, the backward most.
  const int8_t fast_accum = 0;
  AG_CUBLASLT_CHECK(
      lt.matmul_desc_set_attribute(d.matmul, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof fast_accum));
  // The scales stay 1 (no scale pointers): descale applies 1 / (sa sb) in float afterwards, as on the CPU.
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  AG_CUBLASLT_CHECK(lt.matrix_layout_create(&d.first, lt_type(b.dtype()), u(k), u(n), k));
  AG_CUBLASLT_CHECK(lt.matrix_layout_create(&d.second, lt_type(a.dtype()), u(k), u(m), k));
  AG_CUBLASLT_CHECK(lt.matrix_layout_create(&d.result, CUDA_R_32F, u(n), u(m), n));
  AG_CUBLASLT_CHECK(lt.preference_create(&d.preference));
  const uint64_t workspace_bytes = kWorkspaceBytes;
  AG_CUBLASLT_CHECK(lt.preference_set_attribute(d.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &workspace_bytes, sizeof workspace_bytes));
  const cublasLtHandle_t handle = cublaslt_handle();
  // The heuristics' pick, asked once per problem and thread: asking costs host time on every GEMM,
  // and the GPU is often idle then (it waits behind each cast's copy back).
  int device = 0;
  AG_CUDA_CHECK(cudaGetDevice(&device));
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int, int>;
  thread_local std::map<Key, std::optional<cublasLtMatmulAlgo_t>> picks;
  const Key key{device, m, n, k, static_cast<int>(a.dtype()), static_cast<int>(b.dtype())};
  auto pick = picks.find(key);
  if (pick == picks.end()) {
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    const cublasStatus_t status = lt.algo_get_heuristic(handle, d.matmul, d.first, d.second, d.result, d.result,
                                                        d.preference, 1, &heuristic, &found);
    // NOT_SUPPORTED is the heuristics' "no algorithm for this problem": the caller falls back.
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) AG_CUBLASLT_CHECK(status);
    std::optional<cublasLtMatmulAlgo_t> algo;
    if (status == CUBLAS_STATUS_SUCCESS && found > 0) algo = heuristic.algo;
    pick = picks.emplace(key, algo).first;
  }
  if (!pick->second) return false;
  Tensor workspace = Tensor::empty({static_cast<int64_t>(kWorkspaceBytes / 4)}, DType::kFloat32, Device::kCUDA);
  const float alpha = 1.0f, beta = 0.0f;
  // The legacy stream, as every ampgrad kernel: the workspace goes back to the cache when this
  // returns, and the next user of that block is queued after this GEMM on the same stream.
  AG_CUBLASLT_CHECK(lt.matmul(handle, d.matmul, &alpha, b.data_ptr(), d.first, a.data_ptr(), d.second, &beta,
                              out.data_ptr(), d.result, out.data_ptr(), d.result, &*pick->second,
                              workspace.data_ptr(), kWorkspaceBytes, cudaStreamLegacy));
  AG_CUDA_CHECK_LAUNCH("cuBLASLt FP8 GEMM");
  tensor_core_gemms.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace

void gemm_float8(const Tensor& a, Transpose trans_a, const Tensor& b, Transpose trans_b, const Tensor& bias,
                 Tensor& out) {
  AG_CHECK(is_float8(a.dtype()) && is_float8(b.dtype()) && out.dtype() == DType::kFloat32,
           "gemm (CUDA): FP8 operands need FP8 partners and a float32 result; got ", dtype_name(a.dtype()), " x ",
           dtype_name(b.dtype()), " -> ", dtype_name(out.dtype()));
  // The fallback's cuBLAS GEMM adds the bias in out's dtype.
  AG_CHECK(!bias.defined() || bias.dtype() == DType::kFloat32, "gemm (CUDA): with FP8 operands the bias must be ",
           "float32 as the result is; got ", bias.to_string());
  const int64_t m = out.size(-2), n = out.size(-1);
  const int64_t k = trans_a == Transpose::kYes ? a.size(-2) : a.size(-1);
  // TN wants a as [m, k] and b as [n, k]: an operand in the other layout is copied transposed.
  const bool a_copied = trans_a == Transpose::kYes, b_copied = trans_b == Transpose::kNo;
  if (lt_accepts(a, a_copied, b, b_copied, bias, out, m, n, k) && has_float8_tensor_cores()) {
    const Tensor a_mk = a_copied ? transposed(a) : a;
    const Tensor b_nk = b_copied ? transposed(b) : b;
    if (lt_matmul(a_mk, b_nk, out, m, n, k)) return;
  }
  cuda::gemm(a.to(DType::kBFloat16), trans_a, b.to(DType::kBFloat16), trans_b, bias, out);
}

}  // namespace ampgrad::kernels::cuda
