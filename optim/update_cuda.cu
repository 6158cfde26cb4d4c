// Optimizer updates on CUDA: one kernel per parameter updates the FP32 master and state and writes
// the rounded lower-precision parameter in the same pass.
#include "framework/cuda_check.h"
#include "framework/cuda_helpers.h"
#include "framework/error.h"
#include "optim/update_kernels.h"

namespace ampgrad::optim::kernels::cuda {

namespace {

using namespace ::ampgrad::cuda;  // the device helpers of framework/cuda_helpers.h

// w, g, buf, param_copy are (n); buf and param_copy may be null. P: the parameter's device type.
template <typename P>
__global__ void sgd_kernel(float* w, const float* g, float* buf, P* param_copy, int64_t n, SgdScalars s,
                           bool nesterov, bool first) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    float wi = w[i];
    float d = g[i] + s.weight_decay * wi;
    if (buf != nullptr) {
      const float b = first ? d : s.momentum * buf[i] + s.one_minus_dampening * d;
      buf[i] = b;
      d = nesterov ? d + s.momentum * b : b;
    }
    wi -= s.lr * d;
    w[i] = wi;
    if (param_copy != nullptr) param_copy[i] = dstore<P>(wi);
  }
}

// w, g, m, v, param_copy are (n); param_copy may be null. P: the parameter's device type.
template <typename P>
__global__ void adam_kernel(float* w, const float* g, float* m, float* v, P* param_copy, int64_t n,
                            AdamScalars s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    float wi = w[i];
    const float gi = g[i] + s.l2 * wi;
    wi *= s.decoupled;
    const float mi = s.beta1 * m[i] + s.one_minus_beta1 * gi;
    const float vi = s.beta2 * v[i] + s.one_minus_beta2 * gi * gi;
    wi -= s.step_size * mi / (sqrtf(vi) / s.bc2_sqrt + s.eps);
    m[i] = mi;
    v[i] = vi;
    w[i] = wi;
    if (param_copy != nullptr) param_copy[i] = dstore<P>(wi);
  }
}

// Calls fn(P*) with the rounded copy's device pointer (a float* null pointer when there is none).
template <typename Fn>
void with_copy(RoundedCopy copy, Fn&& fn) {
  if (copy.data == nullptr) return fn(static_cast<float*>(nullptr));
  AG_CHECK(is_low_precision(copy.dtype), "optimizer (CUDA): no rounded-copy path for ", dtype_name(copy.dtype));
  visit_floating_dtype(copy.dtype, [&](auto t) { fn(static_cast<DeviceType<decltype(t)>*>(copy.data)); });
}

}  // namespace

void sgd_update(float* w, const float* g, float* buf, RoundedCopy copy, int64_t n, const SgdScalars& s,
                Nesterov nesterov, FirstStep first) {
  if (n == 0) return;
  with_copy(copy, [&](auto* param_copy) {
    sgd_kernel<<<blocks_for(n), kThreads>>>(w, g, buf, param_copy, n, s, nesterov == Nesterov::kYes,
                                            first == FirstStep::kYes);
    AG_CUDA_CHECK_LAUNCH("sgd_kernel");
  });
}

void adam_update(float* w, const float* g, float* m, float* v, RoundedCopy copy, int64_t n, const AdamScalars& s) {
  if (n == 0) return;
  with_copy(copy, [&](auto* param_copy) {
    adam_kernel<<<blocks_for(n), kThreads>>>(w, g, m, v, param_copy, n, s);
    AG_CUDA_CHECK_LAUNCH("adam_kernel");
  });
}

}  // namespace ampgrad::optim::kernels::cuda
