// Unscale + non-finite check in one pass: a loop on CPU, the fused multi-tensor kernel on CUDA.
#include "amp/unscale.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "framework/error.h"
#include "framework/parallel.h"

namespace ampgrad::amp {

namespace {

// The arguments are unused in a CPU-only build, where require_backend throws.
bool unscale_cuda([[maybe_unused]] const std::vector<Tensor>& grads, [[maybe_unused]] double inv_scale,
                  [[maybe_unused]] std::vector<Tensor>& outs) {
  require_backend(Device::kCUDA, "GradScaler::unscale_");
#if defined(AMPGRAD_WITH_CUDA)
  Tensor found_inf = zeros({1}, DType::kFloat32, Device::kCUDA);
  cuda::unscale_and_check_multi(grads, inv_scale, outs, found_inf);
  // The one host sync of a CUDA training step: GradScaler::step must return whether it stepped
  // (a bool on the host), so the device flag is read back here, once per optimizer per iteration.
  return found_inf.item() != 0.0f;
#endif
  return false;
}

}  // namespace

bool unscale_and_check_all(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>& outs) {
  AG_CHECK(grads.size() == outs.size(), "unscale: ", grads.size(), " gradients but ", outs.size(), " outputs");
  bool found_inf = false;
  std::vector<Tensor> cuda_grads, cuda_outs;
  for (size_t k = 0; k < grads.size(); ++k) {
    if (grads[k].device() == Device::kCUDA) {
      cuda_grads.push_back(grads[k]);
      cuda_outs.push_back(outs[k]);
    } else {
      found_inf |= unscale_and_check(grads[k], inv_scale, outs[k]);
    }
  }
  if (!cuda_grads.empty()) found_inf |= unscale_cuda(cuda_grads, inv_scale, cuda_outs);
  return found_inf;
}

namespace {

// o = g * inv_scale (in double, rounded once to float); true if any result is inf or NaN. No
// early exit and no branch, so it vectorises: |v| <= FLT_MAX is false exactly for inf and NaN.
template <typename T>
bool unscale_values(const T* g, int64_t n, double inv_scale, float* o) {
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(static_cast<double>(g[i]) * inv_scale);
    bad |= !(std::fabs(v) <= std::numeric_limits<float>::max());
    o[i] = v;
  }
  return bad != 0;
}

}  // namespace

bool unscale_and_check(const Tensor& grad, double inv_scale, Tensor& out) {
  AG_CHECK(out.dtype() == DType::kFloat32 && out.numel() == grad.numel(), "unscale: output ", out.to_string(),
           " must be float32 with ", grad.numel(), " elements");
  AG_CHECK(grad.device() == out.device(), "unscale: gradient ", grad.to_string(), " and output ", out.to_string(),
           " are on different devices");
  if (grad.device() == Device::kCUDA) {
    std::vector<Tensor> outs{out};
    return unscale_cuda({grad}, inv_scale, outs);
  }
  float* o = out.data<float>();
  const int64_t n = grad.numel();  // hoisted: an out-of-line call per element cost more than the math
  AG_CHECK(is_floating(grad.dtype()), "unscale: gradient ", grad.to_string(), " is not floating");
  std::atomic<bool> any_bad{false};  // pieces run on the pool: one flag, set by whichever finds one
  visit_floating_dtype(grad.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* g = grad.data<T>();
    parallel_range(n, kElementwiseGrain, [&](int64_t lo, int64_t hi) {
      if constexpr (kIsLowPrecision<T>) {
        // Widened a block at a time (vectorised), then the float loop: no per-element conversion calls.
        constexpr int64_t kBlock = 2048;
        float wide[kBlock];
        for (int64_t start = lo; start < hi; start += kBlock) {
          const int64_t len = std::min(kBlock, hi - start);
          widen(g + start, wide, static_cast<size_t>(len));
          if (unscale_values(wide, len, inv_scale, o + start)) any_bad = true;
        }
      } else {
        if (unscale_values(g + lo, hi - lo, inv_scale, o + lo)) any_bad = true;
      }
    });
  });
  out.bump_version();
  return any_bad;
}

}  // namespace ampgrad::amp
