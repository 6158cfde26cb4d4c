// Optimizer checks that the CPU tests and the CUDA tests both run.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>

#include "framework/device.h"
#include "framework/dtype.h"
#include "framework/tensor.h"
#include "optim/adam.h"
#include "test_util.h"

namespace ampgrad::test {

/// Two equal 16-bit parameters of n elements on `device`, stepped twice by AdamW: one given its
/// 16-bit gradient (read widened by the update pass), the other the same values in FP32 on its
/// master (as GradScaler's unscale_ leaves it). Expects the same bits in parameters and masters.
inline void expect_widened_grad_equals_fp32_grad(DType dtype, int64_t n, Device device) {
  const auto values = [&](uint64_t seed) {
    return Tensor::from_vector(random_values(static_cast<size_t>(n), -2.0, 2.0, seed), {n}, dtype, device);
  };
  Tensor a = values(21), b = values(21);
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  optim::AdamW opt_a({a}, {.lr = 1e-2}), opt_b({b}, {.lr = 1e-2});
  for (uint64_t step = 0; step < 2; ++step) {
    const Tensor g = values(30 + step);
    a.set_grad(g);
    b.master().set_grad(g.to(DType::kFloat32));
    opt_a.step();
    opt_b.step();
  }
  EXPECT_EQ(bytes_of(a), bytes_of(b)) << dtype_name(dtype) << " on " << device;
  EXPECT_EQ(bytes_of(a.master()), bytes_of(b.master())) << dtype_name(dtype) << " on " << device;
}

}  // namespace ampgrad::test
