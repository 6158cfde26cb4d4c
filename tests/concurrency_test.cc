// Threads sharing leaves: backward passes running at once on different threads accumulate into a
// shared leaf's grad without losing an update or racing on its first assignment (the order of
// the additions may vary; with integer-valued gradients the sum is exact whatever the order).
// Also run under ThreadSanitizer: `./bazelw test --config=tsan --build_tests_only --test_tag_filters=concurrency //...`.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "amp/autocast.h"
#include "amp/grad_scaler.h"
#include "framework/device.h"
#include "framework/dtype.h"
#include "framework/tensor.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "ops/ops.h"
#include "optim/sgd.h"

namespace ag = ampgrad;
using ag::DType;
using ag::Tensor;

namespace {

#if defined(__SANITIZE_THREAD__)
constexpr int64_t kElements = int64_t{1} << 12;  // ThreadSanitizer is ~10x slower; races show at any size
constexpr int kIterations = 50;
#else
constexpr int64_t kElements = int64_t{1} << 16;
constexpr int kIterations = 200;
#endif
constexpr int kThreads = 4;

// Runs body(thread index) on kThreads threads released together.
template <typename Body>
void run_together(Body body) {
  std::atomic<int> waiting{kThreads};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      waiting.fetch_sub(1);
      while (waiting.load() > 0) std::this_thread::yield();
      body(t);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

void expect_all_equal(const Tensor& t, float expected) {
  ASSERT_TRUE(t.defined());
  int64_t wrong = 0;
  for (float v : t.to_vector()) wrong += v != expected;
  EXPECT_EQ(wrong, 0) << "of " << t.numel() << " elements differ from " << expected;
}

TEST(ConcurrentBackward, SharedLeafReceivesEveryUpdate) {
  for (const DType dtype : {DType::kFloat32, DType::kFloat16}) {
    Tensor w = ag::ones({kElements}, dtype);
    w.set_requires_grad(true);
    run_together([&](int) {
      for (int i = 0; i < kIterations; ++i) ag::ops::sum(w * 1.0f).backward();
    });
    // kThreads * kIterations = 800 is exact in float16 as well.
    expect_all_equal(w.grad(), static_cast<float>(kThreads * kIterations));
    EXPECT_EQ(w.grad().dtype(), dtype);
  }
}

TEST(ConcurrentBackward, FirstAssignmentOfTheGradIsNotLost) {
  // Each round starts with no grad, so every thread races to be the one that assigns it. In
  // w + w both inputs get the same gradient tensor, so the first assignment copies it (a wide
  // window between finding no grad and setting one).
  for (int round = 0; round < kIterations; ++round) {
    Tensor w = ag::ones({kElements / 4});
    w.set_requires_grad(true);
    run_together([&](int) { ag::ops::sum(w + w).backward(); });
    expect_all_equal(w.grad(), static_cast<float>(2 * kThreads));
  }
}

TEST(ConcurrentBackward, ThreadsTrainingSeparateModelsShareNothing) {
  // The tape, grad mode and autocast state are per thread; the CPU pool is shared.
  run_together([](int t) {
    ag::nn::Sequential model{ag::nn::Linear(64, 256), ag::nn::ReLU(), ag::nn::Linear(256, 1)};
    ag::optim::SGD opt(model.parameters(), {.lr = 0.01});
    ag::amp::GradScaler scaler;
    const Tensor x = ag::full({512, 64}, 0.01 * (t + 1));
    const Tensor y = ag::zeros({512, 1});
    for (int i = 0; i < 5; ++i) {
      opt.zero_grad();
      Tensor loss;
      {
        ag::amp::AutocastGuard autocast(ag::Device::kCPU, DType::kFloat16);
        loss = ag::ops::mse_loss(model(x), y);
      }
      scaler.scale(loss).backward();
      EXPECT_TRUE(scaler.step(opt));
      scaler.update();
    }
  });
}

}  // namespace
