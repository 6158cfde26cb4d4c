// Fused SGD and Adam updates on CUDA over FP32 master weights: one kernel per parameter updates the
// master and the state and writes the rounded FP16 copy of the parameter in the same pass.
#pragma once

#include <cstdint>

#include "framework/half.h"

namespace ampgrad::optim::cuda {

struct SgdScalars {
  float lr = 0;
  float weight_decay = 0;
  float momentum = 0;
  float one_minus_dampening = 1;  // 1 - dampening in double, then rounded (as the CPU loop)
};

enum class Nesterov : bool { kNo, kYes };
enum class FirstStep : bool { kNo, kYes };  // SGD's momentum buffer is set to g, not blended

/// Per element (all device pointers, n elements): d = g + wd w; with momentum, buf = first ? d :
/// momentum buf + one_minus_dampening d and d = nesterov ? d + momentum buf : buf; w -= lr d;
/// param_copy = half(w) when non-null. `buf` may be null when momentum == 0. Does nothing when
/// found_inf is non-null and *found_inf != 0 (read on the device: no host sync).
void sgd_update(float* w, const float* g, float* buf, Half* param_copy, int64_t n, const SgdScalars& s,
                Nesterov nesterov, FirstStep first, const float* found_inf);

struct AdamScalars {
  float step_size = 0;  // lr / (1 - beta1^t), from double
  float bc2_sqrt = 1;   // sqrt(1 - beta2^t), from double
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  // 1 - beta in double, then rounded, as the CPU loop: 1.0f - float(beta) differs by up to ~1e-4
  // relative (beta2 = 0.9999), so CUDA and CPU Adam would drift apart.
  float one_minus_beta1 = 0.1f;
  float one_minus_beta2 = 0.001f;
  float eps = 1e-8f;
  float l2 = 0;         // Adam: g += l2 * w
  float decoupled = 1;  // AdamW: w *= 1 - lr * wd
};

/// Per element: g' = g + l2 w; w *= decoupled; m = b1 m + one_minus_beta1 g';
/// v = b2 v + one_minus_beta2 g'^2;
/// w -= step_size m / (sqrt(v) / bc2_sqrt + eps); param_copy = half(w) when non-null.
/// Does nothing when found_inf is non-null and *found_inf != 0.
void adam_update(float* w, const float* g, float* m, float* v, Half* param_copy, int64_t n, const AdamScalars& s,
                 const float* found_inf);

}  // namespace ampgrad::optim::cuda
