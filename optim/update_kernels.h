// Optimizer update kernels: one pass per parameter over FP32 master weights and FP32 state that
// also writes the rounded lower-precision parameter (when there is one) from the new master.
// Element math in float, as PyTorch does for float32 parameters; all pointers are on `device`.
#pragma once

#include <cstdint>

#include "framework/device.h"
#include "framework/dtype.h"

namespace ampgrad::optim::kernels {

/// Where a fused update writes the parameter rounded from the new master: data of `dtype`, or
/// nothing when data is null (a float32 parameter is its own master).
struct RoundedCopy {
  void* data = nullptr;
  DType dtype = DType::kFloat16;
};

struct SgdScalars {
  float lr = 0;
  float weight_decay = 0;
  float momentum = 0;
  float one_minus_dampening = 1;  // 1 - dampening in double, then rounded (as PyTorch)
};
enum class Nesterov : bool { kNo, kYes };
enum class FirstStep : bool { kNo, kYes };  // SGD's momentum buffer is set to g, not blended

// Per element (n elements): d = g + wd w; with momentum (buf non-null), buf = first ? d :
// momentum buf + one_minus_dampening d and d = nesterov ? d + momentum buf : buf; w -= lr d.
namespace cpu {
void sgd_update(float* w, const float* g, float* buf, RoundedCopy copy, int64_t n, const SgdScalars& s,
                Nesterov nesterov, FirstStep first);
}
namespace cuda {
void sgd_update(float* w, const float* g, float* buf, RoundedCopy copy, int64_t n, const SgdScalars& s,
                Nesterov nesterov, FirstStep first);
}
inline void sgd_update(Device device, float* w, const float* g, float* buf, RoundedCopy copy, int64_t n,
                       const SgdScalars& s, Nesterov nesterov, FirstStep first) {
  AG_ON_BACKEND(device, sgd_update, w, g, buf, copy, n, s, nesterov, first);
}

struct AdamScalars {
  float step_size = 0;  // lr / (1 - beta1^t), from double
  float bc2_sqrt = 1;   // sqrt(1 - beta2^t), from double
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  // 1 - beta in double, then rounded (as PyTorch): 1.0f - float(beta2) would be off by 1.3e-5
  // relative for beta2 = 0.999 (1.7e-4 for 0.9999), out of step with the bias correction.
  float one_minus_beta1 = 0.1f;
  float one_minus_beta2 = 0.001f;
  float eps = 1e-8f;
  float l2 = 0;         // Adam: g += l2 * w
  float decoupled = 1;  // AdamW: w *= 1 - lr * wd
};

// Per element: g' = g + l2 w; w *= decoupled; m = b1 m + one_minus_beta1 g';
// v = b2 v + one_minus_beta2 g'^2; w -= step_size m / (sqrt(v) / bc2_sqrt + eps).
namespace cpu {
void adam_update(float* w, const float* g, float* m, float* v, RoundedCopy copy, int64_t n, const AdamScalars& s);
}
namespace cuda {
void adam_update(float* w, const float* g, float* m, float* v, RoundedCopy copy, int64_t n, const AdamScalars& s);
}
inline void adam_update(Device device, float* w, const float* g, float* m, float* v, RoundedCopy copy, int64_t n,
                        const AdamScalars& s) {
  AG_ON_BACKEND(device, adam_update, w, g, m, v, copy, n, s);
}

}  // namespace ampgrad::optim::kernels
