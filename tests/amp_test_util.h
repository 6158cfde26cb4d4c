// Helpers shared by the AMP tests (autocast, GradScaler, master weights): a fixed regression task
// and small training loops (the general helpers are in test_util.h).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "amp/autocast.h"
#include "amp/grad_scaler.h"
#include "framework/allocator.h"
#include "framework/autograd.h"
#include "framework/device.h"
#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/parallel.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "nn/module.h"
#include "nn/utils.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"
#include "test_util.h"

namespace ampgrad::amp_testing {

/// A fixed regression task: y = x w_true + 0.5 relu(x[:, 0]) + noise * N(0, 1), x ~ N(0, 1).
struct Regression {
  Tensor x;  // [n, in] float32
  Tensor y;  // [n, 1] float32
};

inline Regression make_regression(uint64_t seed, int64_t n, int64_t in, double noise) {
  manual_seed(seed);
  Regression data;
  data.x = randn({n, in});
  const Tensor w_true = randn({1, in});
  const std::vector<float> x = data.x.to_vector(), w = w_true.to_vector();
  const std::vector<float> eps = randn({n, 1}).to_vector();
  std::vector<float> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double acc = 0.0;
    for (int64_t j = 0; j < in; ++j) acc += static_cast<double>(x[i * in + j]) * w[j];
    acc += 0.5 * std::max(0.0f, x[i * in]);
    y[i] = static_cast<float>(acc + noise * eps[i]);
  }
  data.y = Tensor::from_vector(y, {n, 1});
  return data;
}

/// The loss of `model` (all parameters of one dtype) on `data`, without autocast: the inputs are
/// cast to the parameters' dtype and the output back to float32 before the loss.
inline double eval_loss(nn::Module& model, const Regression& data) {
  NoGradGuard no_grad;
  const DType dtype = model.parameters().front().dtype();
  const Tensor out = model(data.x.to(dtype)).to(DType::kFloat32);
  return ops::mse_loss(out, data.y).item();
}

}  // namespace ampgrad::amp_testing
