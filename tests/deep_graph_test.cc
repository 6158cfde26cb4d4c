// Deep graphs on a small stack: a million-op chain must backpropagate and be freed (after
// backward, or dropped without one) without recursing once per node, as must a leaf whose grad
// carries a long history.
#include <gtest/gtest.h>
#include <pthread.h>

#include <exception>
#include <functional>
#include <string>

#include "framework/allocator.h"
#include "framework/autograd.h"
#include "framework/device.h"
#include "framework/tensor.h"
#include "ops/ops.h"

namespace ag = ampgrad;
using ag::Tensor;

namespace {

// Smaller than any default thread stack: a recursion of a few frames per node overflows it
// within a few thousand nodes.
constexpr size_t kSmallStack = size_t{256} << 10;
constexpr int64_t kChain = 1'000'000;

// Runs fn on a fresh thread with a `stack_bytes` stack; returns the message of what it threw ("" if nothing).
std::string run_on_small_stack(const std::function<void()>& fn, size_t stack_bytes = kSmallStack) {
  struct Job {
    const std::function<void()>* fn;
    std::string error;
  } job{&fn, ""};
  pthread_attr_t attr;
  EXPECT_EQ(pthread_attr_init(&attr), 0);
  EXPECT_EQ(pthread_attr_setstacksize(&attr, stack_bytes), 0);
  pthread_t thread;
  const auto body = [](void* arg) -> void* {
    Job& j = *static_cast<Job*>(arg);
    try {
      (*j.fn)();
    } catch (const std::exception& e) {
      j.error = e.what();
    }
    return nullptr;
  };
  EXPECT_EQ(pthread_create(&thread, &attr, body, &job), 0);
  EXPECT_EQ(pthread_join(thread, nullptr), 0);
  pthread_attr_destroy(&attr);
  return job.error;
}

Tensor leaf(float value) {
  Tensor t = ag::full({1}, value);
  t.set_requires_grad(true);
  return t;
}

TEST(DeepGraph, MillionOpChainBackpropagatesAndIsFreedOnASmallStack) {
  const int64_t live_before = ag::memory_stats(ag::Device::kCPU).current_bytes;
  float grad = 0.0f;
  const std::string error = run_on_small_stack([&] {
    Tensor x = leaf(3.0f);
    Tensor h = x;
    for (int64_t i = 0; i < kChain; ++i) h = h * 1.0f;
    ag::ops::sum(h).backward();  // the traversal keeps its own stack
    grad = x.grad().item();
  });  // h, and with it the whole chain, is freed here
  EXPECT_EQ(error, "");
  EXPECT_EQ(grad, 1.0f);
  EXPECT_EQ(ag::memory_stats(ag::Device::kCPU).current_bytes, live_before);
}

TEST(DeepGraph, MillionOpChainDroppedWithoutBackwardIsFreedOnASmallStack) {
  const int64_t live_before = ag::memory_stats(ag::Device::kCPU).current_bytes;
  const std::string error = run_on_small_stack([&] {
    Tensor w = leaf(0.5f);
    Tensor h = leaf(1.0f);
    // An RNN-like chain whose nodes save their inputs: each node is held both by the next
    // node's edge and by the tensor that node saved. Three ops per step.
    for (int64_t i = 0; i < kChain / 3; ++i) h = ag::ops::relu(h * w + 1.0f);
  });
  EXPECT_EQ(error, "");
  EXPECT_EQ(ag::memory_stats(ag::Device::kCPU).current_bytes, live_before);
}

TEST(DeepGraph, RetainedGraphIsFreedWithItsSavedTensors) {
  const std::string error = run_on_small_stack([&] {
    Tensor x = leaf(1.0f);
    Tensor h = x;
    for (int64_t i = 0; i < kChain / 10; ++i) h = h * x;  // saves both inputs
    h = ag::ops::sum(h * 0.0f);
    h.backward(Tensor(), ag::RetainGraph::kYes);
    EXPECT_EQ(x.grad().item(), 0.0f);
  });
  EXPECT_EQ(error, "");
}

TEST(DeepGraph, LeafWhoseGradHasALongHistoryIsFreedOnASmallStack) {
  // set_grad accepts any tensor of the right shape, including one with a long history: freeing
  // the leaf frees that history through TensorImpl::grad.
  const std::string error = run_on_small_stack([&] {
    Tensor x = leaf(1.0f);
    Tensor p = leaf(1.0f);
    Tensor h = x;
    for (int64_t i = 0; i < kChain / 10; ++i) h = h * 1.0f;
    p.set_grad(h);
    h = Tensor();
    x = Tensor();
  });
  EXPECT_EQ(error, "");
}

}  // namespace
