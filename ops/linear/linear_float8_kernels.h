// The element-wise kernels of the FP8 linear around its GEMMs (which are linear_kernels.h's gemm
// with FP8 operands and a float32 result): the scaled saturating cast, the amax, the descale.
// Callers have checked shapes, dtypes and devices; outputs are preallocated and overwritten.
#pragma once

#include <cstdint>

#include "framework/device.h"
#include "framework/float8_scaling.h"
#include "framework/tensor.h"
#include "ops/linear/linear_kernels.h"

namespace ampgrad::kernels {

namespace cpu {
/// The largest |src| (0 for an empty tensor; NaN if any element is NaN), as a float.
float amax(const Tensor& src);
/// dst = saturate(src * scale) in dst's 8-bit format (clamped to +-max, NaN kept), element-wise;
/// returns what the cast saw (Float8CastCounts: amax(src), the saturated and flushed counts from
/// the same pass, dst's format, scale and src's numel).
Float8CastCounts quantize_float8(const Tensor& src, float scale, Tensor& dst);
/// quantize_float8 and nothing more: the CPU's GEMM reads either layout of an operand at no cost,
/// so it needs no transposed twin; dst_t is left undefined (unless make_twins_for_testing).
Float8CastCounts quantize_float8_pair(const Tensor& src, float scale, Tensor& dst, Tensor& dst_t);
/// For tests, process-wide: quantize_float8_pair also gives the twin on the CPU, so that the FP8
/// linear's layouts with twins (the CUDA path's operand and saved-tensor choices) run here against
/// the plain ones, which must give the same bits.
void make_twins_for_testing(bool on);
/// out[i, j] = products[i, j] * alpha + bias[j] (bias may be undefined); products is float32 of
/// out's shape. Where alpha is a normal float: in float (alpha rounded to float, one fused
/// multiply-add), then rounded to out's dtype (a second rounding for 16-bit outputs, as an FP32
/// GEMM's epilogue has); else in double, rounded once to out's dtype.
void descale(const Tensor& products, double alpha, const Tensor& bias, Tensor& out);
}  // namespace cpu

namespace cuda {
/// As cpu::amax: one pass, a block reduction, one small device-to-host copy.
float amax(const Tensor& src);
/// As cpu::quantize_float8, code for code (framework/float8.h's saturating cast on the device);
/// the amax and counts come back in one small device-to-host copy.
Float8CastCounts quantize_float8(const Tensor& src, float scale, Tensor& dst);
/// As quantize_float8, and dst_t allocated and filled with dst's transpose in the same pass (one
/// read of src, 32x32 tiles): cuBLASLt's FP8 matmul takes only K-contiguous operands on Hopper.
Float8CastCounts quantize_float8_pair(const Tensor& src, float scale, Tensor& dst, Tensor& dst_t);
/// As cpu::descale.
void descale(const Tensor& products, double alpha, const Tensor& bias, Tensor& out);
/// gemm (linear_kernels.h) with FP8 a and b and a float32 out: cuBLASLt's FP8 matmul where the GPU
/// and the shape allow it, else the operands decoded to bfloat16 (exactly) and the cuBLAS GEMM;
/// FP32 accumulation either way. cuda::gemm hands FP8 operands here.
void gemm_float8(const Tensor& a, Transpose trans_a, const Tensor& b, Transpose trans_b, const Tensor& bias,
                 Tensor& out);
/// Whether the current GPU has FP8 tensor cores (Ada, compute capability 8.9, and newer).
bool has_float8_tensor_cores();
/// For tests, process-wide: how many of gemm_float8's products ran on cuBLASLt's FP8 matmul (not
/// the bfloat16 fallback).
int64_t float8_tensor_core_gemms_for_testing();
}  // namespace cuda

inline float amax(const Tensor& src) { return AG_ON_BACKEND(src.device(), amax, src); }
inline Float8CastCounts quantize_float8(const Tensor& src, float scale, Tensor& dst) {
  return AG_ON_BACKEND(dst.device(), quantize_float8, src, scale, dst);
}
/// The scaled cast of a matrix for FP8 GEMMs that read it both ways: src and dst are (rows, cols),
/// dst as quantize_float8 (the same codes, amax and counts). Where the device's FP8 GEMM wants
/// K-contiguous operands (CUDA), dst_t is allocated (cols, rows) and holds dst's transpose, from
/// the same pass; elsewhere (the CPU) it is left undefined and nothing more is done.
inline Float8CastCounts quantize_float8_pair(const Tensor& src, float scale, Tensor& dst, Tensor& dst_t) {
  return AG_ON_BACKEND(dst.device(), quantize_float8_pair, src, scale, dst, dst_t);
}
inline void descale(const Tensor& products, double alpha, const Tensor& bias, Tensor& out) {
  AG_ON_BACKEND(out.device(), descale, products, alpha, bias, out);
}

}  // namespace ampgrad::kernels
