// CPU unscale + non-finite check in one pass.
#include "amp/unscale.h"

#include <cmath>

#include "framework/error.h"

namespace ampgrad::amp {

bool unscale_and_check(const Tensor& grad, double inv_scale, Tensor& out) {
  AG_CHECK(out.dtype() == DType::kFloat32 && out.numel() == grad.numel(), "unscale: output ", out.to_string(),
           " must be float32 with ", grad.numel(), " elements");
  AG_CHECK(grad.device() == Device::kCPU && out.device() == Device::kCPU,
           "unscale: the CUDA path is not built into this scaler yet (", grad.to_string(), ")");
  bool found_inf = false;
  float* o = out.data<float>();
  visit_dtype(grad.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* g = grad.data<T>();
    for (int64_t i = 0; i < grad.numel(); ++i) {
      const float v = static_cast<float>(static_cast<double>(load(g[i])) * inv_scale);
      found_inf |= !std::isfinite(v);
      o[i] = v;
    }
  });
  out.bump_version();
  return found_inf;
}

}  // namespace ampgrad::amp
