// Activation modules: the pattern for a layer without parameters (forward calls the op).
#pragma once

#include "nn/module.h"

namespace ampgrad::nn {

/// max(x, 0) element-wise.
class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

}  // namespace ampgrad::nn
