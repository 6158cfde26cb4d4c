// nn::LayerNorm: normalisation over the last dimension with a learned scale and shift.
#pragma once

#include "nn/module.h"

namespace ampgrad::nn {

/// Whether a LayerNorm learns a per-feature scale and shift.
enum class ElementwiseAffine : bool { kNo, kYes };

/// (x - mean) / sqrt(var + eps) * weight + bias over the last dimension of size
/// normalized_shape; weight = 1 and bias = 0 at first (PyTorch's init).
class LayerNorm : public Module {
 public:
  /// Normalises the last dimension, of size normalized_shape, with learnable weight and bias unless affine is kNo.
  explicit LayerNorm(int64_t normalized_shape, double eps = 1e-5, ElementwiseAffine affine = ElementwiseAffine::kYes);
  Tensor forward(const Tensor& x) override;

  Tensor& weight;  ///< [normalized_shape]; undefined without affine
  Tensor& bias;    ///< [normalized_shape]; undefined without affine
  double eps;  ///< added to the variance before the square root
};

}  // namespace ampgrad::nn
