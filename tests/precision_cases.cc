// Precision checks shared by the CPU and CUDA suites (see precision_cases.h).
#include "precision_cases.h"

#include <cmath>
#include <vector>

#include "ops/ops.h"

namespace ampgrad::test {

::testing::AssertionResult check_cross_entropy_at_large_offsets(Device device) {
  for (const double c : {0.0, 1e4, -1e4, 2e4, 1e5, -1e5, 1e6, -1e6}) {
    Tensor logits = Tensor::from_vector(std::vector<double>{c, c + 0.5, c - 1}, {1, 3}, DType::kFloat32).to(device);
    logits.set_requires_grad(true);
    const Tensor loss = ops::cross_entropy(logits, Tensor::from_vector(std::vector<int64_t>{0}, {1}).to(device));
    loss.backward();
    // float64 on the stored float32 values: lse - x_0, and softmax - one-hot.
    const std::vector<double> x = logits.to_double_vector();
    double sum = 0.0;
    for (double v : x) sum += std::exp(v - x[1]);
    const double lse = x[1] + std::log(sum);
    const double want_loss = lse - x[0];
    const float got_loss = loss.item();
    if (std::abs(got_loss - want_loss) > 4 * eps(DType::kFloat32) * std::abs(want_loss)) {
      return ::testing::AssertionFailure() << "offset " << c << ": loss " << got_loss << ", float64 " << want_loss;
    }
    const std::vector<float> grad = logits.grad().to_vector();
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = std::exp(x[i] - lse) - (i == 0 ? 1.0 : 0.0);
      if (std::abs(grad[i] - want) > 4 * eps(DType::kFloat32) * (std::abs(want) + 0.25)) {
        return ::testing::AssertionFailure() << "offset " << c << ": gradient " << i << " is " << grad[i]
                                             << ", float64 " << want;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace ampgrad::test
