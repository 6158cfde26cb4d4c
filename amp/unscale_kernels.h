// The scaler's one pass over gradients, a kernel family like those of ops/ (AG_ON_BACKEND in
// framework/device.h): unscale and look for inf/NaN together, optionally measuring every value
// (grad_counts.h). The cpu:: loops are in unscale_cpu.cc, the cuda:: fused multi-tensor kernels in
// unscale_cuda.cu. Every tensor of a call is on the one device named; the callers (unscale.h)
// group a list by device and have checked the outputs.
#pragma once

#include <vector>

#include "amp/diagnostics/grad_counts.h"
#include "framework/device.h"
#include "framework/tensor.h"

namespace ampgrad::amp::kernels {

// For every k: outs[k] (float32) = grads[k] * inv_scale, the product formed in double and rounded
// once; returns whether any result is inf or NaN. On CUDA ONE launch covers every tensor and the
// flag comes back in ONE host sync (PyTorch's _amp_foreach_non_finite_check_and_unscale_ idea).
namespace cpu {
bool unscale_and_check(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>& outs);
}
namespace cuda {
bool unscale_and_check(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>& outs);
}
inline bool unscale_and_check(Device device, const std::vector<Tensor>& grads, double inv_scale,
                              std::vector<Tensor>& outs) {
  return AG_ON_BACKEND(device, unscale_and_check, grads, inv_scale, outs);
}

// The same pass that also measures: counts[k] (zeroed by the caller) receives grads[k]'s counts
// against `formats`. outs may be null: then nothing is written (measure only). The unscaled values
// are bit-identical to unscale_and_check's; returns whether any unscaled value is inf or NaN. On
// CUDA the counts and the flag come back together in one host sync.
namespace cpu {
bool unscale_check_and_measure(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>* outs,
                               const FormatTable& formats, GradCounts* counts);
}
namespace cuda {
bool unscale_check_and_measure(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>* outs,
                               const FormatTable& formats, GradCounts* counts);
}
inline bool unscale_check_and_measure(Device device, const std::vector<Tensor>& grads, double inv_scale,
                                      std::vector<Tensor>* outs, const FormatTable& formats, GradCounts* counts) {
  return AG_ON_BACKEND(device, unscale_check_and_measure, grads, inv_scale, outs, formats, counts);
}

}  // namespace ampgrad::amp::kernels
