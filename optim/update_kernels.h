// Optimizer update kernels: ONE multi-tensor pass (framework/multi_tensor.h) over a step's
// parameters on one device updates the FP32 master weights and FP32 state and writes each rounded lower-precision
// parameter (where there is one) from its new master while it is in cache or registers. Element
// math in float, as PyTorch does for float32 parameters; a 16-bit gradient is widened as it is
// read (exactly), so no FP32 copy of it is made. Scalars come per tensor, so parameters of
// different groups (learning rates) and step counts (Adam's bias corrections) share the pass.
// A 16-bit weights tensor (MasterWeights::kStochasticRounding: no master) is widened as it is
// read, updated in float and rounded back stochastically (framework/stochastic_rounding.h), its
// random bits keyed by the scalars' rounding_key and each element's index in the tensor.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "framework/device.h"
#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/multi_tensor.h"

namespace ampgrad::optim::kernels {

/// The lists of an SGD pass; tensor k of each belongs to parameter k.
enum SgdList : int {
  kSgdWeight,    ///< its weights: the FP32 master, or a 16-bit parameter rounded stochastically
  kSgdGrad,      ///< its gradient: float32, or the 16-bit parameter's own (widened exactly as it is read)
  kSgdMomentum,  ///< its momentum buffer (undefined: no momentum)
  kSgdRounded,   ///< the 16-bit parameter to write rounded (undefined: a float32 parameter is its own master, or 16-bit weights rounded stochastically)
  kSgdLists      ///< the number of lists
};
/// The tensors of an SGD pass, by SgdList.
using SgdLists = multi_tensor::TensorLists<kSgdLists>;

/// One parameter's SGD scalars.
struct SgdScalars {
  float lr = 0;            ///< the learning rate
  float weight_decay = 0;  ///< L2 weight decay
  float momentum = 0;      ///< the momentum factor
  float one_minus_dampening = 1;  ///< 1 - dampening in double, then rounded (as PyTorch)
  bool nesterov = false;    ///< Nesterov momentum
  bool first_step = false;  ///< the momentum buffer is set to d, not blended
  uint64_t rounding_key = 0;  ///< 16-bit weights: the key of their stochastic rounding's random bits
};

// Per element: d = g + wd w; with momentum, buf = first_step ? d : momentum buf +
// one_minus_dampening d and d = nesterov ? d + momentum buf : buf; w -= lr d.
namespace cpu {
void sgd_update(const std::vector<multi_tensor::Chunk<kSgdLists>>& chunks, const std::vector<SgdScalars>& scalars);
}
namespace cuda {
void sgd_update(const std::vector<multi_tensor::Chunk<kSgdLists>>& chunks, const std::vector<SgdScalars>& scalars);
}

/// The lists of an Adam or AdamW pass; tensor k of each belongs to parameter k.
enum AdamList : int {
  kAdamWeight,    ///< its weights, as kSgdWeight
  kAdamGrad,      ///< its gradient: float32 or 16-bit, as kSgdGrad
  kAdamExpAvg,    ///< m, FP32
  kAdamExpAvgSq,  ///< v, FP32
  kAdamRounded,   ///< the 16-bit parameter to write rounded (undefined for float32 parameters)
  kAdamLists      ///< the number of lists
};
/// The tensors of an Adam pass, by AdamList.
using AdamLists = multi_tensor::TensorLists<kAdamLists>;

/// One parameter's Adam scalars.
struct AdamScalars {
  float step_size = 0;  ///< lr / (1 - beta1^t), from double
  float bc2_sqrt = 1;   ///< sqrt(1 - beta2^t), from double
  float beta1 = 0.9f;    ///< the first moment's decay
  float beta2 = 0.999f;  ///< the second moment's decay
  // 1 - beta in double, then rounded (as PyTorch): 1.0f - float(beta2) would be off by 1.3e-5
  // relative for beta2 = 0.999 (1.7e-4 for 0.9999), out of step with the bias correction.
  float one_minus_beta1 = 0.1f;    ///< 1 - beta1, see above
  float one_minus_beta2 = 0.001f;  ///< 1 - beta2, see above
  float eps = 1e-8f;               ///< added to the denominator
  float l2 = 0;         ///< Adam: g += l2 * w
  float decoupled = 1;  ///< AdamW: w *= 1 - lr * wd
  uint64_t rounding_key = 0;  ///< 16-bit weights: the key of their stochastic rounding's random bits
};

// Per element: g' = g + l2 w; w *= decoupled; m = b1 m + one_minus_beta1 g';
// v = b2 v + one_minus_beta2 g'^2; w -= step_size m / (sqrt(v) / bc2_sqrt + eps).
namespace cpu {
void adam_update(const std::vector<multi_tensor::Chunk<kAdamLists>>& chunks, const std::vector<AdamScalars>& scalars);
}
namespace cuda {
void adam_update(const std::vector<multi_tensor::Chunk<kAdamLists>>& chunks, const std::vector<AdamScalars>& scalars);
}

namespace detail {
// The checks of an update pass, before it writes anything: `names` name the lists; the first
// `required` lists have a tensor for every parameter; every tensor has list 0's element count and
// device; state is float32, gradients float32 or 16-bit (read widened, exactly), the rounded
// copies (the last list) 16-bit, the weights float32, or 16-bit where there is no rounded copy.
template <size_t Lists>
void check_update_lists(const char* who, const multi_tensor::TensorLists<Lists>& lists,
                        const std::array<const char*, Lists>& names, size_t required, size_t scalars) {
  AG_CHECK(scalars == lists[0].size(), who, ": ", lists[0].size(), " parameters but ", scalars, " sets of scalars");
  for (size_t l = 0; l < Lists; ++l) {
    AG_CHECK(lists[l].size() == lists[0].size(), who, ": ", lists[l].size(), " ", names[l], " for ",
             lists[0].size(), " parameters");
  }
  for (size_t l = 0; l < Lists; ++l) {
    for (size_t k = 0; k < lists[l].size(); ++k) {
      const Tensor& t = lists[l][k];
      AG_CHECK(t.defined() || l >= required, who, ": parameter ", k, " of the pass has no ", names[l]);
      if (!t.defined()) continue;
      const bool sixteen_bit = is_low_precision(t.dtype()) && element_size(t.dtype()) == 2;
      const bool ok_dtype = l == 1           ? t.dtype() == DType::kFloat32 || sixteen_bit
                            : l == Lists - 1 ? sixteen_bit
                            : l == 0         ? t.dtype() == DType::kFloat32 || (sixteen_bit && !lists[Lists - 1][k].defined())
                                             : t.dtype() == DType::kFloat32;
      AG_CHECK(ok_dtype, who, ": the ", names[l], " of parameter ", k, " of the pass is ", t.to_string(), "; hint: ",
               l == Lists - 1 ? "the rounded copy is a 16-bit parameter"
               : l == 0       ? "weights are an FP32 master, or a 16-bit parameter (rounded stochastically) without "
                                "a rounded copy"
                              : "state is float32, gradients float32 or 16-bit");
      const Tensor& master = lists[0][k];
      AG_CHECK(t.numel() == master.numel() && t.device() == master.device(), who, ": the ", names[l],
               " of parameter ", k, " of the pass is ", t.to_string(), " but its ", names[0], " is ",
               master.to_string(), "; hint: ", l == 1 ? "the gradient must match its parameter"
                                                   : "was the optimizer state loaded for other shapes, or left on "
                                                     "another device?");
    }
  }
}
}  // namespace detail

/// One SGD pass over every parameter in `lists`, all on `device` (see SgdList). Checks
/// everything before it writes anything.
inline void sgd_update(Device device, const SgdLists& lists, const std::vector<SgdScalars>& scalars) {
  detail::check_update_lists<kSgdLists>("SGD update", lists, {"weights", "gradient", "momentum buffer", "rounded copy"},
                                        kSgdMomentum, scalars.size());
  AG_ON_BACKEND(device, sgd_update, multi_tensor::make_chunks("SGD update", lists, device), scalars);
}

/// One Adam or AdamW pass over every parameter in `lists`, all on `device` (see AdamList).
/// Checks everything before it writes anything.
inline void adam_update(Device device, const AdamLists& lists, const std::vector<AdamScalars>& scalars) {
  detail::check_update_lists<kAdamLists>("Adam update", lists,
                                         {"weights", "gradient", "exp_avg", "exp_avg_sq", "rounded copy"},
                                         kAdamRounded, scalars.size());
  AG_ON_BACKEND(device, adam_update, multi_tensor::make_chunks("Adam update", lists, device), scalars);
}

}  // namespace ampgrad::optim::kernels
