// nn::Linear: y = x W^T + b. The pattern for a layer with parameters: register them in the
// constructor and keep the returned references as public members.
#pragma once

#include "nn/module.h"

namespace ampgrad::nn {

/// Whether a Linear layer has a bias.
enum class Bias : bool { kNo, kYes };

/// y = x W^T + b; W [out, in] Kaiming-uniform, b [out] uniform in +-1/sqrt(in) (PyTorch's init).
/// x [..., in] -> [..., out].
class Linear : public Module {
 public:
  /// Maps in_features to out_features, with a bias unless Bias::kNo.
  Linear(int64_t in_features, int64_t out_features, Bias bias = Bias::kYes);
  Tensor forward(const Tensor& x) override;

  // Slots in the module's shared state: `lin.weight = t` reaches every handle to this layer.
  Tensor& weight;  ///< [out, in]
  Tensor& bias;    ///< [out]; undefined with Bias::kNo
};

}  // namespace ampgrad::nn
