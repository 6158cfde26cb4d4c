// Element-wise kernels: binary arithmetic with broadcasting, affine maps, relu. Storage T, compute
// in float (double for float64), rounded once per element: out = store(f(load(a), load(b))).
// Callers have checked shapes, dtypes and devices; outputs are preallocated and overwritten.
#pragma once

#include "framework/cpu_features.h"
#include "framework/device.h"
#include "framework/tensor.h"

namespace ampgrad::kernels {

enum class BinaryOp : uint8_t { kAdd, kSub, kMul, kDiv };

// out = a (op) b with NumPy broadcasting: out has the broadcast shape of a and b (any ranks), and
// each operand is read as if stretched to it (no expanded copy is made).
namespace cpu { void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out); }
namespace cuda { void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out); }
inline void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  AG_ON_BACKEND(out.device(), binary, op, a, b, out);
}

// out = alpha * src + beta, src broadcast to out's shape (NumPy rules): scaling, shifting and
// stretching a gradient back over broadcast dimensions. src may be out itself (in place).
namespace cpu { void affine(const Tensor& src, double alpha, double beta, Tensor& out); }
namespace cuda { void affine(const Tensor& src, double alpha, double beta, Tensor& out); }
inline void affine(const Tensor& src, double alpha, double beta, Tensor& out) {
  AG_ON_BACKEND(out.device(), affine, src, alpha, beta, out);
}

// y = x > 0 ? x : 0, and NaN stays NaN (as in PyTorch).
namespace cpu { void relu(const Tensor& x, Tensor& y); }
namespace cuda { void relu(const Tensor& x, Tensor& y); }
inline void relu(const Tensor& x, Tensor& y) { AG_ON_BACKEND(y.device(), relu, x, y); }

// dx = x <= 0 ? 0 : dy: a NaN input passes its gradient (as PyTorch's threshold_backward).
namespace cpu { void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx); }
namespace cuda { void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx); }
inline void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  AG_ON_BACKEND(dx.device(), relu_backward, x, dy, dx);
}

// A unary op whose formula is in unary_math.h (one place for both backends): the formula's index
// in UnaryFormulas there, as unary_op<Formula>() gives it.
enum class UnaryOp : uint8_t {};

// y = f(x), same shape. On the CPU, `isa` caps the instruction-set level of the formula's loops
// below what effective_cpu_isa() allows (kNative: no further cap; unlike the GEMM's kernel choice,
// it never lifts AMPGRAD_CPU_ISA's cap); the tests run each level against the baseline's bits.
namespace cpu { void unary(UnaryOp op, const Tensor& x, Tensor& y, CpuIsa isa = CpuIsa::kNative); }
namespace cuda { void unary(UnaryOp op, const Tensor& x, Tensor& y); }
inline void unary(UnaryOp op, const Tensor& x, Tensor& y) { AG_ON_BACKEND(y.device(), unary, op, x, y); }

// dx = dy * f'(x), from x, the forward's output y = f(x) and dy (same shapes).
namespace cpu {
void unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx,
                    CpuIsa isa = CpuIsa::kNative);
}
namespace cuda { void unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx); }
inline void unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  AG_ON_BACKEND(dx.device(), unary_backward, op, x, y, dy, dx);
}

// y = x * keep_i / (1 - p), keep_i = (uniform(seed, i) >= p): the same mask for the same seed on
// every backend (a counter-based hash of (seed, i), see dropout_mask.h), so the backward applies
// it to dy with the same call. p in [0, 1); callers handle p = 1 (all zero).
namespace cpu { void dropout(const Tensor& x, double p, uint64_t seed, Tensor& y); }
namespace cuda { void dropout(const Tensor& x, double p, uint64_t seed, Tensor& y); }
inline void dropout(const Tensor& x, double p, uint64_t seed, Tensor& y) {
  AG_ON_BACKEND(y.device(), dropout, x, p, seed, y);
}

}  // namespace ampgrad::kernels
