// The loss-scaling experiment behind examples/underflow_demo (and its test): one model, data and
// optimizer trained four ways, on a task whose true gradients are tiny (1e-5 to 1e-8).
#pragma once

#include <cstdint>
#include <string>

#include "ampgrad.h"

namespace underflow {

enum class Mode { kFp32, kFp16NoScaling, kFp16StaticScale, kFp16DynamicScale };

std::string mode_name(Mode mode);

struct Result {
  double final_loss = 0.0;            // unweighted MSE on the training batch, in FP32
  double zero_grad_fraction = 0.0;    // share of weight-gradient values exactly 0, over all steps
  double median_abs_fp32_grad = 0.0;  // typical true gradient magnitude (FP32 run), for the table
  int64_t skipped_steps = 0;
  double final_scale = 1.0;           // 1 when no scaling is used
};

struct Config {
  int64_t steps = 400;
  double loss_weight = 1e-4;   // a small loss weight, as in multi-task training: makes gradients tiny
  double static_scale = 1048576.0;  // 2^20
  ampgrad::Device device = ampgrad::Device::kCPU;
};

/// Trains the same seeded model on the same seeded data in `mode` and reports what happened.
Result train(Mode mode, const Config& config = {});

}  // namespace underflow
