// nn::LayerNorm (over the last dimension) and nn::BatchNorm2d (per channel, with running
// statistics): normalisation with a learned scale and shift.
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

/// BatchNorm2d's options (PyTorch's constructor arguments).
struct BatchNormOptions {
  double eps = 1e-5;                 ///< added to the variance before the square root
  double momentum = 0.1;             ///< running = (1 - momentum) running + momentum batch
  bool affine = true;                ///< learn weight (1 at first) and bias (0)
  bool track_running_stats = true;   ///< keep running statistics (else batch statistics in eval too)
};

/// Batch normalisation of x [N, C, H, W] per channel (ops::batch_norm): batch statistics in
/// training, which also update the running ones; the running statistics after eval(). Buffers
/// running_mean (0), running_var (1) and num_batches_tracked (int64, the training forwards) are
/// saved in checkpoints under PyTorch's names and are not trained.
class BatchNorm2d : public Module {
 public:
  /// Normalises num_features channels.
  explicit BatchNorm2d(int64_t num_features, const BatchNormOptions& options = {});
  Tensor forward(const Tensor& x) override;

  Tensor& weight;               ///< [C]; undefined without affine
  Tensor& bias;                 ///< [C]; undefined without affine
  Tensor& running_mean;         ///< [C]; undefined without track_running_stats
  Tensor& running_var;          ///< [C]; undefined without track_running_stats
  Tensor& num_batches_tracked;  ///< int64 []; undefined without track_running_stats
  BatchNormOptions options;     ///< eps, momentum and the flags
};

}  // namespace ampgrad::nn
