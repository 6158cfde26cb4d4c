// Helpers shared by the AMP tests (autocast, GradScaler, master weights): byte snapshots,
// error-message checks, a fixed regression task and small training loops.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ampgrad.h"

namespace ampgrad::amp_testing {

/// The raw bytes of a tensor's storage (for "bit-identical" checks).
inline std::vector<uint8_t> bytes_of(const Tensor& t) {
  std::vector<uint8_t> out(static_cast<size_t>(t.numel()) * element_size(t.dtype()));
  if (!out.empty()) std::memcpy(out.data(), t.data_ptr(), out.size());
  return out;
}

/// Expects fn() to throw ampgrad::Error whose message contains `needle`.
inline void expect_error_containing(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected ampgrad::Error containing \"" << needle << "\", nothing was thrown";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message \"" << e.what() << "\" lacks \"" << needle << "\"";
  }
}

inline bool all_finite(const Tensor& t) {
  for (double v : t.to_double_vector()) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

/// max_i |a_i - b_i| over two equally sized tensors of any dtype.
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_double_vector(), y = b.to_double_vector();
  EXPECT_EQ(x.size(), y.size());
  double worst = 0.0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

inline double max_abs(const Tensor& t) {
  double worst = 0.0;
  for (double v : t.to_double_vector()) worst = std::max(worst, std::abs(v));
  return worst;
}

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
