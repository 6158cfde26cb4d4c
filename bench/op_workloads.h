// Single-op workloads for step_timer (mirrored in pytorch_workloads.py), each with the bytes it
// moves or the FLOP it does, so step_timer can print GB/s or GFLOP/s beside the time:
//   add_bias_{fp32,fp16}      x [64,512,768] + b [768]           (reads x, writes the sum)
//   add_residual_{fp32,fp16}  x [64,512,768] + r [64,512,768]    (reads both, writes the sum)
//   bmm_{fp32,fp16}           a [8,12,256,64] @ b [8,12,64,256]  (attention's scores)
//   copy_bandwidth            a 96 MiB float copy on the pool: the machine's copy bandwidth
#pragma once

#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "ampgrad.h"

namespace ampgrad::bench {

struct OpWorkload {
  std::function<void()> run;
  double bytes = 0;  // moved per run (read + written), for GB/s; 0 when flop is the figure
  double flop = 0;   // per run, for GFLOP/s
};

/// The workload called `name`, or nullptr if there is none.
inline std::unique_ptr<OpWorkload> make_op_workload(const std::string& name) {
  const DType dtype = name.ends_with("_fp16") ? DType::kFloat16 : DType::kFloat32;
  const double elem = static_cast<double>(element_size(dtype));
  manual_seed(0);
  if (name.starts_with("add_bias_") || name.starts_with("add_residual_")) {
    const bool bias = name.starts_with("add_bias_");
    const Tensor x = randn({64, 512, 768}, dtype);
    const Tensor y = bias ? randn({768}, dtype) : randn({64, 512, 768}, dtype);
    const double n = static_cast<double>(x.numel());
    return std::make_unique<OpWorkload>(OpWorkload{[x, y] { Tensor z = x + y; }, (bias ? 2 : 3) * n * elem, 0});
  }
  if (name.starts_with("bmm_")) {
    const Tensor a = randn({8, 12, 256, 64}, dtype), b = randn({8, 12, 64, 256}, dtype);
    return std::make_unique<OpWorkload>(OpWorkload{[a, b] { ops::matmul(a, b); }, 0, 2.0 * 96 * 256 * 256 * 64});
  }
  if (name == "copy_bandwidth") {
    // The same size as the add workloads' float operands, first touched here so no page faults
    // are timed; copied in pieces on the pool, as the element-wise ops run.
    const int64_t n = int64_t{64} * 512 * 768;
    auto src = std::make_shared<std::vector<float>>(n, 1.0f), dst = std::make_shared<std::vector<float>>(n, 0.0f);
    return std::make_unique<OpWorkload>(OpWorkload{[src, dst, n] {
                                                     parallel_range(n, kElementwiseGrain, [&](int64_t lo, int64_t hi) {
                                                       std::memcpy(dst->data() + lo, src->data() + lo,
                                                                   static_cast<size_t>(hi - lo) * sizeof(float));
                                                     });
                                                   },
                                                   2.0 * static_cast<double>(n) * sizeof(float), 0});
  }
  return nullptr;
}

}  // namespace ampgrad::bench
