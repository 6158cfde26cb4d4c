// The CPU's float GEMM: a packed, cache-blocked GEMM in the GotoBLAS/BLIS style whose register tile
// is picked by instruction-set level (linear_gemm_micro_cpu.h: AVX2/FMA 6x16, AVX-512 8x32),
// spread over the CPU pool (framework/parallel.h). FP16 operands (and BF16 ones below the
// avx512_bf16 level) are widened while they are packed, so they cost FP32's arithmetic plus O(n^2)
// conversions; BF16 x BF16 on AVX512_BF16 is packed as pairs for VDPBF16PS, two k per instruction.
// A 16-bit result is rounded once from the float sum.
#pragma once

#include <cstdint>

#include "framework/dtype.h"
#include "ops/linear/linear_gemm_micro_cpu.h"

namespace ampgrad::kernels::cpu {

/// A read-only matrix: element (i, j) is data[i * row_stride + j * col_stride], stored as `dtype`
/// (float32, float16, bfloat16 or an 8-bit float). A transpose is the same data with the strides swapped.
struct MatrixView {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  int64_t row_stride = 0, col_stride = 0;
};

struct GemmOptions {
  // null: default_micro_kernel(a.dtype) when a and b share their dtype, else the float kernel;
  // tests pass each level's.
  const MicroKernel* kernel = nullptr;
};

/// c = a b (+ bias[n] added to every row), for a [m, k] and b [k, n], accumulated in float. c is
/// row-major [m, n] of c_dtype (float32, or float16/bfloat16 rounded once from the float sum).
/// bias is n contiguous values (any of the three), or a view with null data for none. Every
/// kernel gives the same bits (each element is bias, then one FMA per k in order), except that the
/// BF16 pair kernel flushes subnormal inputs and partial sums to zero (see Packing). Either way an
/// element's bits do not depend on m, n or the thread count: products too small to pack run the
/// kernel's own arithmetic (MicroKernel::direct). k = 0 gives the bias as it is (or zeros).
/// Throws if options.kernel takes BF16 pairs and a or b is not bfloat16.
void sgemm(int64_t m, int64_t n, int64_t k, const MatrixView& a, const MatrixView& b, const MatrixView& bias, void* c,
           DType c_dtype, const GemmOptions& options = {});

}  // namespace ampgrad::kernels::cpu
