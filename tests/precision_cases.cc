// Precision checks shared by the CPU and CUDA suites (see precision_cases.h).
#include "precision_cases.h"

#include <cmath>
#include <vector>

#include "ops/ops.h"

namespace ampgrad::test {

::testing::AssertionResult check_cross_entropy_at_large_offsets(Device device, DType dtype) {
  constexpr int64_t kClasses = 3;
  for (const double smoothing : {0.0, 0.1}) {
    for (const double c : {0.0, 1e4, -1e4, 2e4, 1e5, -1e5, 1e6, -1e6}) {
      Tensor logits = Tensor::from_vector(std::vector<double>{c, c + 0.5, c - 1}, {1, kClasses}, dtype).to(device);
      logits.set_requires_grad(true);
      const Tensor target = Tensor::from_vector(std::vector<int64_t>{0}, {1}).to(device);
      const Tensor loss = ops::cross_entropy(logits, target, {.label_smoothing = smoothing});
      loss.backward();
      // float64 on the stored values: the target distribution q = (1 - eps) one-hot + eps / C,
      // loss = sum_c q_c (lse - x_c), gradient = softmax - q; lse - x_c = (max - x_c) + log_sum,
      // never rounded at the offset (x[1] is the maximum).
      const std::vector<double> x = logits.to_double_vector();
      double sum = 0.0;
      for (double v : x) sum += std::exp(v - x[1]);
      const double log_sum = std::log(sum);
      const auto q = [&](size_t i) { return (i == 0 ? 1.0 - smoothing : 0.0) + smoothing / kClasses; };
      double want_loss = 0.0;
      for (size_t i = 0; i < x.size(); ++i) want_loss += q(i) * ((x[1] - x[i]) + log_sum);
      const double tol = 4 * eps(dtype);
      const double got_loss = loss.to_double_vector()[0];
      if (std::abs(got_loss - want_loss) > tol * std::abs(want_loss)) {
        return ::testing::AssertionFailure() << "offset " << c << ", smoothing " << smoothing << ": loss " << got_loss
                                             << ", float64 " << want_loss;
      }
      const std::vector<double> grad = logits.grad().to_double_vector();
      for (size_t i = 0; i < x.size(); ++i) {
        const double want = std::exp((x[i] - x[1]) - log_sum) - q(i);
        if (std::abs(grad[i] - want) > tol * (std::abs(want) + 0.25)) {
          return ::testing::AssertionFailure() << "offset " << c << ", smoothing " << smoothing << ": gradient " << i
                                               << " is " << grad[i] << ", float64 " << want;
        }
      }
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace ampgrad::test
