// The CPU's float GEMM: a packed, cache-blocked GEMM in the GotoBLAS/BLIS style whose register tile
// is picked by instruction-set level (linear_gemm_micro_cpu.h: AVX2/FMA 6x16, AVX-512 12x32),
// spread over the CPU pool (framework/parallel.h). FP16 and BF16 operands are widened while they
// are packed and a 16-bit result is rounded once from the float sum, so they cost the same
// arithmetic as FP32 plus O(n^2) conversions, never an O(n^3) one.
#pragma once

#include <cstdint>

#include "framework/dtype.h"
#include "ops/linear_gemm_micro_cpu.h"

namespace ampgrad::kernels::cpu {

/// A read-only matrix: element (i, j) is data[i * row_stride + j * col_stride], stored as `dtype`
/// (float32, float16 or bfloat16). A transpose is the same data with the strides swapped.
struct MatrixView {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  int64_t row_stride = 0, col_stride = 0;
};

struct GemmOptions {
  const MicroKernel* kernel = nullptr;  // null: default_micro_kernel(); tests pass each level's
};

/// c = a b (+ bias[n] added to every row), for a [m, k] and b [k, n], accumulated in float. c is
/// row-major [m, n] of c_dtype (float32, or float16/bfloat16 rounded once from the float sum).
/// bias is n contiguous values (any of the three), or a view with null data for none. Every
/// kernel gives the same bits (each element is bias, then one FMA per k in order).
void sgemm(int64_t m, int64_t n, int64_t k, const MatrixView& a, const MatrixView& b, const MatrixView& bias, void* c,
           DType c_dtype, const GemmOptions& options = {});

}  // namespace ampgrad::kernels::cpu
