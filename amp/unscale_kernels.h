// The scaler's one pass over gradients, a kernel family like those of ops/ (AG_ON_BACKEND in
// framework/device.h) over a multi-tensor chunk table (framework/multi_tensor.h): unscale and look
// for inf/NaN together, optionally measuring every value (grad_counts.h). The cpu:: functors are
// in unscale_cpu.cc, the cuda:: ones in unscale_cuda.cu. Every tensor of a call is on the one
// device named; the callers (unscale.h) group a list by device and have checked the outputs.
#pragma once

#include <vector>

#include "amp/diagnostics/grad_counts.h"
#include "framework/device.h"
#include "framework/error.h"
#include "framework/multi_tensor.h"
#include "framework/tensor.h"

namespace ampgrad::amp::kernels {

/// The lists of an unscale pass.
enum UnscaleList : int {
  kUnscaleGrad,  ///< the gradients (any floating dtype)
  kUnscaleOut,   ///< their float32 outputs (undefined where the pass only measures)
  kUnscaleLists  ///< the number of lists
};
/// The chunk table of an unscale pass.
using UnscaleChunks = std::vector<multi_tensor::Chunk<kUnscaleLists>>;

// For every chunk: out = grad * inv_scale, the product formed in double and rounded once to
// float; returns whether any result is inf or NaN. On CUDA ONE launch covers every tensor and the
// flag comes back in ONE host sync (PyTorch's _amp_foreach_non_finite_check_and_unscale_).
namespace cpu { bool unscale_and_check(const UnscaleChunks& chunks, double inv_scale); }
namespace cuda { bool unscale_and_check(const UnscaleChunks& chunks, double inv_scale); }

// The same pass that also measures: counts[k] (zeroed, one per tensor of the lists) receives
// tensor k's counts against `formats`; chunks without an output write nothing. The unscaled values
// are bit-identical to unscale_and_check's; returns whether any unscaled value is inf or NaN. On
// CUDA the counts and the flag come back together in one host sync.
namespace cpu {
bool unscale_check_and_measure(const UnscaleChunks& chunks, double inv_scale, const FormatTable& formats,
                               GradCounts* counts, size_t tensors);
}
namespace cuda {
bool unscale_check_and_measure(const UnscaleChunks& chunks, double inv_scale, const FormatTable& formats,
                               GradCounts* counts, size_t tensors);
}

namespace detail {
inline UnscaleChunks unscale_chunks(const char* who, Device device, const std::vector<Tensor>& grads,
                                    const std::vector<Tensor>* outs) {
  for (const Tensor& g : grads) {
    AG_CHECK(is_compute(g.dtype()), who, ": gradient ", g.to_string(),
             " is not float32, float16, bfloat16 or float64 (integer tensors have no gradients; 8-bit ones are cast first)");
  }
  return multi_tensor::make_chunks<kUnscaleLists>(
      who, {grads, outs != nullptr ? *outs : std::vector<Tensor>(grads.size())}, device);
}
}  // namespace detail

/// outs[k] (float32) = grads[k] * inv_scale for every k; whether any result is inf or NaN.
inline bool unscale_and_check(Device device, const std::vector<Tensor>& grads, double inv_scale,
                              std::vector<Tensor>& outs) {
  const bool found_inf =
      AG_ON_BACKEND(device, unscale_and_check, detail::unscale_chunks("unscale", device, grads, &outs), inv_scale);
  for (Tensor& o : outs) o.bump_version();
  return found_inf;
}

/// unscale_and_check that also measures grads[k] into counts[k] (zeroed by the caller); outs may
/// be null: then nothing is written (measure only).
inline bool unscale_check_and_measure(Device device, const std::vector<Tensor>& grads, double inv_scale,
                                      std::vector<Tensor>* outs, const FormatTable& formats, GradCounts* counts) {
  const bool found_inf =
      AG_ON_BACKEND(device, unscale_check_and_measure,
                    detail::unscale_chunks("gradient statistics", device, grads, outs), inv_scale, formats, counts,
                    grads.size());
  if (outs != nullptr) {
    for (Tensor& o : *outs) o.bump_version();
  }
  return found_inf;
}

}  // namespace ampgrad::amp::kernels
