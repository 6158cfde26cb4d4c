// Element-wise CUDA kernels: binary ops and affine maps with NumPy broadcasting (a StridedPlan per
// launch), relu and its backward. Store T, compute float (double for float64). Same-shape operands
// take a vectorised path: 16-byte loads/stores (8 halves, 4 floats, 2 doubles) per thread.
#include "framework/cuda_check.h"
#include "framework/cuda_helpers.h"
#include "ops/elementwise/dropout_mask.h"
#include "ops/elementwise/elementwise_kernels.h"
#include "ops/strided.h"
#include "ops/elementwise/unary_math.h"

namespace ampgrad::kernels::cuda {

namespace {

using namespace ::ampgrad::cuda;  // the device helpers of framework/cuda_helpers.h

struct AddOp {
  template <typename C> __device__ C operator()(C x, C y) const { return x + y; }
};
struct SubOp {
  template <typename C> __device__ C operator()(C x, C y) const { return x - y; }
};
struct MulOp {
  template <typename C> __device__ C operator()(C x, C y) const { return x * y; }
};
struct DivOp {
  template <typename C> __device__ C operator()(C x, C y) const { return x / y; }
};

/// 16 bytes of T, loaded and stored as one vector access.
template <typename T>
struct alignas(16) Vec {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// a, b, out are (n), 16-byte aligned: out = op(a, b); full vectors then a scalar tail.
template <typename T, typename Op>
__global__ void binary_vec_kernel(const T* a, const T* b, T* out, int64_t n, Op op) {
  using V = Vec<T>;
  const int64_t nvec = n / V::kSize;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < nvec; i += stride) {
    const V va = reinterpret_cast<const V*>(a)[i];
    const V vb = reinterpret_cast<const V*>(b)[i];
    V vo;
#pragma unroll
    for (int k = 0; k < V::kSize; ++k) vo.v[k] = dstore<T>(op(dload(va.v[k]), dload(vb.v[k])));
    reinterpret_cast<V*>(out)[i] = vo;
  }
  for (int64_t i = nvec * V::kSize + blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += stride) {
    out[i] = dstore<T>(op(dload(a[i]), dload(b[i])));
  }
}

// plan walks (out, a, b) over out's shape, a and b broadcast: out = op(a, b) element by element.
template <typename T, typename Op>
__global__ void binary_plan_kernel(const T* a, const T* b, T* out, StridedPlan<3> plan, Op op) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < plan.numel; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[3];
    plan_offsets(plan, i, off);
    out[off[0]] = dstore<T>(op(dload(a[off[1]]), dload(b[off[2]])));
  }
}

template <typename T, typename Op>
void launch_binary(const Tensor& a, const Tensor& b, Tensor& out, Op op) {
  const T* pa = static_cast<const T*>(a.data_ptr());
  const T* pb = static_cast<const T*>(b.data_ptr());
  T* po = static_cast<T*>(out.data_ptr());
  const int64_t n = out.numel(), na = a.numel(), nb = b.numel();
  if (n == 0) return;
  const bool vec = na == n && nb == n && aligned16(pa) && aligned16(pb) && aligned16(po);
  if (vec) {
    binary_vec_kernel<T><<<blocks_for(n, Vec<T>::kSize), kThreads>>>(pa, pb, po, n, op);
  } else {
    const StridedPlan<3> plan = make_plan<3>(
        out.shape(), {contiguous_strides(out.shape()), broadcast_strides(a.shape(), out.shape()),
                      broadcast_strides(b.shape(), out.shape())});
    binary_plan_kernel<T><<<blocks_for(n), kThreads>>>(pa, pb, po, plan, op);
  }
  AG_CUDA_CHECK_LAUNCH(vec ? "binary_vec_kernel" : "binary_plan_kernel");
}

// src and out are (n): out = alpha * src + beta in the compute type (no index arithmetic).
template <typename T>
__global__ void affine_kernel(const T* src, Compute<T> alpha, Compute<T> beta, T* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = dstore<T>(alpha * dload(src[i]) + beta);
  }
}

// plan walks (out, src) over out's shape, src broadcast: out = alpha * src + beta.
template <typename T>
__global__ void affine_plan_kernel(const T* src, Compute<T> alpha, Compute<T> beta, T* out, StridedPlan<2> plan) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < plan.numel; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[2];
    plan_offsets(plan, i, off);
    out[off[0]] = dstore<T>(alpha * dload(src[off[1]]) + beta);
  }
}

// x, y are (n): y = x > 0 ? x : 0, and NaN stays NaN (as in PyTorch).
template <typename T>
__global__ void relu_kernel(const T* x, T* y, int64_t n) {
  unrolled_loop<T>(n, [&](int64_t i) { return x[i]; },
                   [&](int64_t i, T v) { y[i] = !(dload(v) <= 0) ? v : dstore<T>(0); });
}

// x, dy, dx are (n): dx = x <= 0 ? 0 : dy (a NaN x passes dy).
template <typename T>
__global__ void relu_backward_kernel(const T* x, const T* dy, T* dx, int64_t n) {
  struct Pair {
    T x, dy;
  };
  unrolled_loop<Pair>(n, [&](int64_t i) { return Pair{x[i], dy[i]}; },
                      [&](int64_t i, Pair p) { dx[i] = dload(p.x) <= 0 ? dstore<T>(0) : p.dy; });
}

// x, y are (n): y = F::forward(x) in the compute type.
template <typename T, typename F>
__global__ void unary_kernel(const T* x, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = dstore<T>(F::template forward<Compute<T>>(dload(x[i])));
  }
}

// x, y, dy, dx are (n): dx = F::backward(x, y, dy).
template <typename T, typename F>
__global__ void unary_backward_kernel(const T* x, const T* y, const T* dy, T* dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    dx[i] = dstore<T>(F::template backward<Compute<T>>(dload(x[i]), dload(y[i]), dload(dy[i])));
  }
}

// x, y are (n): y = x * keep / (1 - p), keep from the counter-based hash of (seed, i).
template <typename T>
__global__ void dropout_kernel(const T* x, T* y, int64_t n, float threshold, Compute<T> scale, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const bool keep = dropout_uniform(seed, static_cast<uint64_t>(i)) >= threshold;
    y[i] = keep ? dstore<T>(dload(x[i]) * scale) : dstore<T>(Compute<T>(0));
  }
}

}  // namespace

void unary(UnaryOp op, const Tensor& x, Tensor& y) {
  const int64_t n = y.numel();
  if (n == 0) return;
  visit_unary(op, [&](auto formula) {
    using F = decltype(formula);
    visit_floating_dtype(y.dtype(), [&](auto t) {
      using T = DeviceType<decltype(t)>;
      unary_kernel<T, F><<<blocks_for(n), kThreads>>>(static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), n);
      AG_CUDA_CHECK_LAUNCH("unary_kernel");
    });
  });
}

void unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  const int64_t n = dx.numel();
  if (n == 0) return;
  visit_unary(op, [&](auto formula) {
    using F = decltype(formula);
    visit_floating_dtype(dx.dtype(), [&](auto t) {
      using T = DeviceType<decltype(t)>;
      unary_backward_kernel<T, F><<<blocks_for(n), kThreads>>>(
          static_cast<const T*>(x.data_ptr()), static_cast<const T*>(y.data_ptr()), static_cast<const T*>(dy.data_ptr()),
          static_cast<T*>(dx.data_ptr()), n);
      AG_CUDA_CHECK_LAUNCH("unary_backward_kernel");
    });
  });
}

void dropout(const Tensor& x, double p, uint64_t seed, Tensor& y) {
  const int64_t n = y.numel();
  if (n == 0) return;
  visit_floating_dtype(y.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    dropout_kernel<T><<<blocks_for(n), kThreads>>>(static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()),
                                                   n, static_cast<float>(p), static_cast<Compute<T>>(1.0 / (1.0 - p)),
                                                   seed);
    AG_CUDA_CHECK_LAUNCH("dropout_kernel");
  });
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  visit_floating_dtype(out.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    switch (op) {
      case BinaryOp::kAdd: launch_binary<T>(a, b, out, AddOp{}); break;
      case BinaryOp::kSub: launch_binary<T>(a, b, out, SubOp{}); break;
      case BinaryOp::kMul: launch_binary<T>(a, b, out, MulOp{}); break;
      case BinaryOp::kDiv: launch_binary<T>(a, b, out, DivOp{}); break;
    }
  });
}

void affine(const Tensor& src, double alpha, double beta, Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  visit_floating_dtype(out.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    using C = Compute<T>;
    const T* s = static_cast<const T*>(src.data_ptr());
    T* o = static_cast<T*>(out.data_ptr());
    if (src.numel() == n) {
      affine_kernel<T><<<blocks_for(n), kThreads>>>(s, static_cast<C>(alpha), static_cast<C>(beta), o, n);
    } else {
      const StridedPlan<2> plan =
          make_plan<2>(out.shape(), {contiguous_strides(out.shape()), broadcast_strides(src.shape(), out.shape())});
      affine_plan_kernel<T><<<blocks_for(n), kThreads>>>(s, static_cast<C>(alpha), static_cast<C>(beta), o, plan);
    }
    AG_CUDA_CHECK_LAUNCH(src.numel() == n ? "affine_kernel" : "affine_plan_kernel");
  });
}

void relu(const Tensor& x, Tensor& y) {
  const int64_t n = y.numel();
  if (n == 0) return;
  visit_floating_dtype(y.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    relu_kernel<T><<<blocks_for(n, kUnroll), kThreads>>>(static_cast<const T*>(x.data_ptr()),
                                                         static_cast<T*>(y.data_ptr()), n);
    AG_CUDA_CHECK_LAUNCH("relu_kernel");
  });
}

void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  const int64_t n = dx.numel();
  if (n == 0) return;
  visit_floating_dtype(dx.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    relu_backward_kernel<T><<<blocks_for(n, kUnroll), kThreads>>>(static_cast<const T*>(x.data_ptr()),
                                                                  static_cast<const T*>(dy.data_ptr()),
                                                                  static_cast<T*>(dx.data_ptr()), n);
    AG_CUDA_CHECK_LAUNCH("relu_backward_kernel");
  });
}

}  // namespace ampgrad::kernels::cuda
