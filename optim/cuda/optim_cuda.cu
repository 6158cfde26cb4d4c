// Fused optimizer kernels: state and master in FP32, the FP16 parameter written in the same pass.
// A set found-inf flag makes every thread return before touching memory (state bit-identical).
#include "optim/cuda/optim_cuda.h"

#include "framework/cuda/cuda_check.h"
#include "framework/cuda/cuda_device.h"

namespace ampgrad::optim::cuda {

namespace {

using ::ampgrad::cuda::blocks_for;
using ::ampgrad::cuda::kThreads;

// w, g, buf, param_copy are (n); found_inf is (1) or null.
__global__ void sgd_kernel(float* w, const float* g, float* buf, __half* param_copy, int64_t n, SgdScalars s,
                           bool nesterov, bool first, const float* found_inf) {
  if (found_inf != nullptr && *found_inf != 0.0f) return;
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
    if (param_copy != nullptr) param_copy[i] = __float2half_rn(wi);
  }
}

// w, g, m, v, param_copy are (n); found_inf is (1) or null.
__global__ void adam_kernel(float* w, const float* g, float* m, float* v, __half* param_copy, int64_t n,
                            AdamScalars s, const float* found_inf) {
  if (found_inf != nullptr && *found_inf != 0.0f) return;
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
    if (param_copy != nullptr) param_copy[i] = __float2half_rn(wi);
  }
}

}  // namespace

void sgd_update(float* w, const float* g, float* buf, Half* param_copy, int64_t n, const SgdScalars& s,
                Nesterov nesterov, FirstStep first, const float* found_inf) {
  if (n == 0) return;
  sgd_kernel<<<blocks_for(n), kThreads>>>(w, g, buf, reinterpret_cast<__half*>(param_copy), n, s,
                                          nesterov == Nesterov::kYes, first == FirstStep::kYes, found_inf);
  AG_CUDA_CHECK_LAUNCH();
}

void adam_update(float* w, const float* g, float* m, float* v, Half* param_copy, int64_t n, const AdamScalars& s,
                 const float* found_inf) {
  if (n == 0) return;
  adam_kernel<<<blocks_for(n), kThreads>>>(w, g, m, v, reinterpret_cast<__half*>(param_copy), n, s, found_inf);
  AG_CUDA_CHECK_LAUNCH();
}

}  // namespace ampgrad::optim::cuda
