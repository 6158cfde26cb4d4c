// Precision checks shared by the CPU and CUDA suites (see precision_cases.h).
#include "precision_cases.h"

#include <cmath>
#include <vector>

#include "amp/autocast.h"
#include "framework/allocator.h"
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

::testing::AssertionResult check_cross_entropy_reads_16bit_logits_in_place(Device device, DType low) {
  constexpr int64_t kRows = 64, kVocab = 50304;
  Tensor logits = ops::scale(randn({kRows, kVocab}), 4.0).to(low).to(device);
  logits.set_requires_grad(true);
  std::vector<int64_t> ids(kRows);
  for (int64_t i = 0; i < kRows; ++i) ids[static_cast<size_t>(i)] = (i * 7919) % kVocab;
  ids[5] = -100;  // one ignored sample
  const Tensor target = Tensor::from_vector(ids, {kRows}).to(device);

  const int64_t gradient_bytes = kRows * kVocab * static_cast<int64_t>(dtype_info(low).size);
  allocator_for(device).reset_peak();
  const int64_t live = memory_stats(device).current_bytes;
  Tensor loss;
  {
    amp::AutocastGuard autocast(device, low);
    loss = ops::cross_entropy(logits, target);
  }
  loss.backward();
  const int64_t held = memory_stats(device).peak_bytes - live;
  if (loss.dtype() != DType::kFloat32) return ::testing::AssertionFailure() << "the loss is " << dtype_name(loss.dtype());
  if (held > gradient_bytes + gradient_bytes / 8) {
    return ::testing::AssertionFailure() << "the allocator held " << held << " bytes over the forward and backward; the "
                                         << "gradient takes " << gradient_bytes << ", a float32 copy of the logits "
                                         << 2 * gradient_bytes << " more";
  }

  Tensor wide = logits.detach().to(DType::kFloat32);  // exact
  wide.set_requires_grad(true);
  const Tensor wide_loss = ops::cross_entropy(wide, target);
  wide_loss.backward();
  if (loss.item() != wide_loss.item()) {
    return ::testing::AssertionFailure() << "loss " << loss.item() << ", float32 path " << wide_loss.item();
  }
  const std::vector<double> got = logits.grad().to_double_vector();
  const std::vector<double> want = wide.grad().to(low).to_double_vector();
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      return ::testing::AssertionFailure() << "gradient " << i << " is " << got[i] << ", the float32 path's rounded "
                                           << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace ampgrad::test
