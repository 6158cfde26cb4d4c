// The CPU's float GEMM: a packed, cache-blocked GEMM in the GotoBLAS/BLIS style with an AVX2/FMA
// 6x16 register tile, spread over the CPU pool (framework/parallel.h). FP16 operands are widened while
// they are packed and an FP16 result is rounded once from the float sum, so FP16 costs the same
// arithmetic as FP32 plus O(n^2) conversions, never an O(n^3) one.
#pragma once

#include <cstdint>

#include "framework/dtype.h"

namespace ampgrad::kernels::cpu {

/// A read-only matrix: element (i, j) is data[i * row_stride + j * col_stride], stored as `dtype`
/// (float32 or float16). A transpose is the same data with the strides swapped.
struct MatrixView {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  int64_t row_stride = 0, col_stride = 0;
};

/// c = a b (+ bias[n] added to every row), for a [m, k] and b [k, n], accumulated in float. c is
/// row-major [m, n] of c_dtype (float32, or float16 rounded once from the float sum). bias is n
/// contiguous values (float32 or float16), or a view with null data for none.
void sgemm(int64_t m, int64_t n, int64_t k, const MatrixView& a, const MatrixView& b, const MatrixView& bias, void* c,
           DType c_dtype);

}  // namespace ampgrad::kernels::cpu
