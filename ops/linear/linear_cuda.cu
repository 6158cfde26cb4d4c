// GEMM through cuBLAS (loaded at run time, see cublas.h). float16 and bfloat16:
// cublasGemmStridedBatchedEx with 16-bit inputs/outputs (CUDA_R_16F, CUDA_R_16BF) and FP32 compute
// (CUBLAS_COMPUTE_32F: tensor cores, FP32 accumulation, one rounding of the result), or 16-bit
// inputs and a float32 output (the FP8 fallback). float32: FP32, TF32 only when
// cuda::set_allow_tf32(true). float64: FP64. A bias is fused by pre-filling C and using beta = 1.
// FP8 operands go to gemm_float8 (linear_float8_gemm_cuda.cu: cuBLASLt).
#include <algorithm>
#include <limits>
#include <vector>

#include "framework/cuda_check.h"
#include "framework/cuda_helpers.h"
#include "ops/linear/cublas.h"
#include "ops/linear/linear_float8_kernels.h"
#include "ops/linear/linear_kernels.h"

namespace ampgrad::kernels::cuda {

namespace {

using namespace ::ampgrad::cuda;  // the device helpers of framework/cuda_helpers.h

// out is (rows, n) row-major, bias is (n): out[r, j] = bias[j]; the GEMM then adds into it (beta =
// 1). Threads along x take columns, blocks along y take rows: each thread loads its bias element
// once, and no index needs a 64-bit division.
template <typename T>
__global__ void broadcast_rows_kernel(T* out, const T* bias, int64_t n, int64_t rows) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < n; j += int64_t{gridDim.x} * blockDim.x) {
    const T b = bias[j];
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) out[r * n + j] = b;
  }
}

cublasOperation_t op_of(Transpose t) { return t == Transpose::kYes ? CUBLAS_OP_T : CUBLAS_OP_N; }

// The GEMM's name in launch profiles: its layout as row-major op(a) op(b) (N or T each), batched or not.
const char* gemm_name(Transpose ta, Transpose tb, bool batched) {
  static constexpr const char* kNames[2][4] = {
      {"cuBLAS GEMM NN", "cuBLAS GEMM NT", "cuBLAS GEMM TN", "cuBLAS GEMM TT"},
      {"cuBLAS batched GEMM NN", "cuBLAS batched GEMM NT", "cuBLAS batched GEMM TN", "cuBLAS batched GEMM TT"}};
  return kNames[batched][(ta == Transpose::kYes) * 2 + (tb == Transpose::kYes)];
}

}  // namespace

cublasHandle_t cublas_handle() {
  // One handle per (thread, device): handles are not thread-safe to share. They are deliberately
  // never destroyed: destroying at thread/process exit can run after the CUDA context is gone.
  thread_local std::vector<cublasHandle_t> handles;
  int device = 0;
  AG_CUDA_CHECK(cudaGetDevice(&device));
  if (handles.size() <= static_cast<size_t>(device)) handles.resize(static_cast<size_t>(device) + 1, nullptr);
  if (handles[device] == nullptr) {
    // Cached only once fully set up: if cublasSetStream threw, a cached handle would be reused
    // later on the wrong stream.
    cublasHandle_t handle = nullptr;
    AG_CUBLAS_CHECK(cublas().create(&handle));
    const cublasStatus_t status = cublas().set_stream(handle, cudaStreamLegacy);
    if (status != CUBLAS_STATUS_SUCCESS) {
      cublas().destroy(handle);
      throw_cublas_error(__FILE__, __LINE__, "cublasSetStream(handle, cudaStreamLegacy)", status);
    }
    handles[device] = handle;
  }
  return handles[device];
}

void gemm(const Tensor& a, Transpose trans_a, const Tensor& b, Transpose trans_b, const Tensor& bias, Tensor& out) {
  if (is_float8(a.dtype()) || is_float8(b.dtype())) {
    gemm_float8(a, trans_a, b, trans_b, bias, out);
    return;
  }
  const auto batch_of = [](const Tensor& t) { return t.dim() == 3 ? t.size(0) : int64_t{1}; };
  const int64_t batch = batch_of(out);
  const int64_t m = out.size(-2), n = out.size(-1);
  const int64_t k = trans_a == Transpose::kYes ? a.size(-2) : a.size(-1);
  if (m == 0 || n == 0 || batch == 0) return;
  // cuBLAS takes int dimensions and leading dimensions (each ld is one of m, n, k): a larger one
  // would be truncated into a wrong (or negative) size, so refuse it instead of computing garbage.
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  AG_CHECK(m <= kIntMax && n <= kIntMax && k <= kIntMax && batch <= kIntMax, "gemm (CUDA): dimensions M = ", m,
           ", N = ", n, ", K = ", k, ", batch = ", batch, " exceed cuBLAS's int limit ", kIntMax);
  const bool has_bias = bias.defined();
  const DType dtype = out.dtype();
  if (has_bias) {
    visit_floating_dtype(dtype, [&](auto t) {
      using T = DeviceType<decltype(t)>;
      // About 16 rows per block: enough blocks to fill the GPU, few enough that each does real work.
      const dim3 grid(blocks_for(n), static_cast<unsigned>(std::clamp<int64_t>(batch * m / 16, 1, 65535)));
      broadcast_rows_kernel<T><<<grid, kThreads>>>(static_cast<T*>(out.data_ptr()),
                                                   static_cast<const T*>(bias.data_ptr()), n, batch * m);
      AG_CUDA_CHECK_LAUNCH("broadcast_rows_kernel");
    });
  }
  if (k == 0) {  // empty product: out = bias (already there) or 0; cuBLAS is not asked about k = 0
    const size_t nbytes = static_cast<size_t>(out.numel()) * element_size(dtype);
    if (!has_bias) AG_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, nbytes, cudaStreamLegacy));
    return;
  }
  // Row-major trick: a row-major X[r, c] is the column-major X^T with leading dimension c, so
  // the row-major C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T: swap the
  // operands, keep each one's transpose flag, and use (m', n') = (n, m); ld = row length.
  // A batch is one strided-batched call; an operand every product shares has stride 0.
  cublasHandle_t handle = cublas_handle();
  const cublasOperation_t op_first = op_of(trans_b), op_second = op_of(trans_a);
  const int cm = static_cast<int>(n), cn = static_cast<int>(m), ck = static_cast<int>(k);
  const int ld_first = static_cast<int>(b.size(-1)), ld_second = static_cast<int>(a.size(-1)), ldc = static_cast<int>(n);
  const long long stride_first = batch_of(b) == 1 ? 0 : b.size(-2) * b.size(-1);
  const long long stride_second = batch_of(a) == 1 ? 0 : a.size(-2) * a.size(-1);
  const long long stride_c = m * n;
  // DISALLOW_REDUCED_PRECISION_REDUCTION: otherwise cuBLAS may add split-K partials of a 16-bit
  // GEMM in the output type, rounding more than once; large K (weight gradients) hits that.
  AG_CUBLAS_CHECK(cublas().set_math_mode(
      handle, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  // Scalars in the compute type: FP32 for CUBLAS_COMPUTE_32F (16-bit floats and float32), FP64 for float64.
  const float alpha32 = 1.0f, beta32 = has_bias ? 1.0f : 0.0f;
  const double alpha64 = 1.0, beta64 = has_bias ? 1.0 : 0.0;
  const bool f64 = dtype == DType::kFloat64;
  const auto type_of = [](DType t) {
    return t == DType::kFloat16    ? CUDA_R_16F
           : t == DType::kBFloat16 ? CUDA_R_16BF
           : t == DType::kFloat64  ? CUDA_R_64F
                                   : CUDA_R_32F;
  };
  // a and b share a dtype; out has it too but for 16-bit operands with a float32 result.
  const cudaDataType_t in_type = type_of(a.dtype()), type = type_of(dtype);
  // float32 keeps full FP32 multiplies unless cuda::set_allow_tf32(true) asks for TF32 tensor cores.
  const bool tf32 = a.dtype() == DType::kFloat32 && ::ampgrad::cuda::allow_tf32();
  const cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F : tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : static_cast<const void*>(&alpha32);
  const void* beta = f64 ? static_cast<const void*>(&beta64) : static_cast<const void*>(&beta32);
  if (batch == 1) {
    // One product: the plain GEMM, as PyTorch's addmm issues (cuBLAS may choose other kernels for
    // a strided batch of one), and what bench/cuda_bench.cc times as "cuBLAS alone".
    AG_CUBLAS_CHECK(cublas().gemm_ex(handle, op_first, op_second, cm, cn, ck, alpha, b.data_ptr(), in_type, ld_first,
                                     a.data_ptr(), in_type, ld_second, beta, out.data_ptr(), type, ldc, compute,
                                     CUBLAS_GEMM_DEFAULT));
  } else {
    AG_CUBLAS_CHECK(cublas().gemm_strided_batched_ex(handle, op_first, op_second, cm, cn, ck, alpha, b.data_ptr(),
                                                     in_type, ld_first, stride_first, a.data_ptr(), in_type, ld_second,
                                                     stride_second, beta, out.data_ptr(), type, ldc, stride_c,
                                                     static_cast<int>(batch), compute, CUBLAS_GEMM_DEFAULT));
  }
  AG_CUDA_CHECK_LAUNCH(gemm_name(trans_a, trans_b, batch != 1));
}

}  // namespace ampgrad::kernels::cuda
