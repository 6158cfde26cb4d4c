// Adam / AdamW update on FP32 master weights. Bias corrections in double, element math in float
// (as PyTorch does for float32 parameters).
#include "optim/adam.h"

#include <cmath>

#include "framework/error.h"
#include "framework/parallel.h"

#if defined(AMPGRAD_WITH_CUDA)
#include "optim/cuda/optim_cuda.h"
#endif

namespace ampgrad::optim {

Adam::Adam(std::vector<Tensor> params, AdamOptions options) : Adam(std::move(params), options, Decay::kL2) {}

Adam::Adam(std::vector<Tensor> params, AdamOptions options, Decay decay)
    : Optimizer(std::move(params)), options_(options), decay_(decay) {
  const char* name = decay == Decay::kL2 ? "Adam" : "AdamW";
  set_lr(options.lr);
  AG_CHECK(options.beta1 >= 0 && options.beta1 < 1, name, ": beta1 must be in [0, 1), got ", options.beta1);
  AG_CHECK(options.beta2 >= 0 && options.beta2 < 1, name, ": beta2 must be in [0, 1), got ", options.beta2);
  AG_CHECK(options.eps >= 0 && std::isfinite(options.eps), name, ": eps must be finite and >= 0, got ", options.eps);
  AG_CHECK(options.weight_decay >= 0 && std::isfinite(options.weight_decay), name,
           ": weight_decay must be finite and >= 0, got ", options.weight_decay);
  states_.resize(parameters().size());
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions o)
    : Adam(std::move(params), {.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay},
           Decay::kDecoupled) {}

void Adam::save_param_state(size_t index, ParamState& out) const {
  const State& s = states_[index];
  out.counters["step"] = s.step;
  if (s.step > 0) {
    out.tensors["exp_avg"] = s.exp_avg;
    out.tensors["exp_avg_sq"] = s.exp_avg_sq;
  }
}

void Adam::load_param_state(size_t index, const ParamState& in) {
  auto step = in.counters.find("step");
  AG_CHECK(step != in.counters.end() && step->second >= 0, name(), "::load_state: parameter ", index,
           " needs a 'step' counter >= 0");
  State s;
  s.step = step->second;
  if (s.step > 0) {
    s.exp_avg = loaded_tensor(index, in, "exp_avg");
    s.exp_avg_sq = loaded_tensor(index, in, "exp_avg_sq");
  }
  states_[index] = s;
}

Optimizer::ParamCopy Adam::update(size_t index, Tensor& master, const Tensor& grad) {
#if !defined(AMPGRAD_WITH_CUDA)
  AG_CHECK(master.device() == Device::kCPU, "Adam: ", master.to_string(),
           " is on CUDA but this build has no CUDA backend");
#endif
  State& s = states_[index];
  if (s.step == 0) {
    s.exp_avg = zeros(master.shape(), DType::kFloat32, master.device());
    s.exp_avg_sq = zeros(master.shape(), DType::kFloat32, master.device());
  }
  s.step += 1;
  const double bias_correction1 = 1.0 - std::pow(options_.beta1, static_cast<double>(s.step));
  const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(options_.beta2, static_cast<double>(s.step)));
  const float step_size = static_cast<float>(lr_ / bias_correction1);
  const float bc2_sqrt = static_cast<float>(bias_correction2_sqrt);
  const float b1 = static_cast<float>(options_.beta1), b2 = static_cast<float>(options_.beta2);
  // 1 - beta in double, then rounded (as PyTorch does): 1.0f - float(beta2) would be off by
  // 1.3e-5 relative for beta2 = 0.999 (1.7e-4 for 0.9999), out of step with the bias correction.
  const float one_minus_b1 = static_cast<float>(1.0 - options_.beta1);
  const float one_minus_b2 = static_cast<float>(1.0 - options_.beta2);
  const float eps = static_cast<float>(options_.eps), wd = static_cast<float>(options_.weight_decay);
  const float decoupled = decay_ == Decay::kDecoupled ? static_cast<float>(1.0 - lr_ * options_.weight_decay) : 1.0f;
  const float l2 = decay_ == Decay::kL2 ? wd : 0.0f;

  const int64_t n = master.numel();
#if defined(AMPGRAD_WITH_CUDA)
  if (master.device() == Device::kCUDA) {
    // One fused kernel: master, both moments and (for an FP16 parameter) its rounded copy.
    Tensor copy = fused_param_copy(index);
    const cuda::AdamScalars scalars{.step_size = step_size, .bc2_sqrt = bc2_sqrt, .beta1 = b1, .beta2 = b2,
                                    .one_minus_beta1 = one_minus_b1, .one_minus_beta2 = one_minus_b2,
                                    .eps = eps, .l2 = l2, .decoupled = decoupled};
    cuda::adam_update(master.data<float>(), grad.data<float>(), s.exp_avg.data<float>(), s.exp_avg_sq.data<float>(),
                      copy.defined() ? copy.data<Half>() : nullptr, n, scalars, /*found_inf=*/nullptr);
    s.exp_avg.bump_version();
    s.exp_avg_sq.bump_version();
    return copy.defined() ? ParamCopy::kWritten : ParamCopy::kNeeded;
  }
#endif
  float* w = master.data<float>();
  const float* g = grad.data<float>();
  float* m = s.exp_avg.data<float>();
  float* v = s.exp_avg_sq.data<float>();
  parallel_range(n, kElementwiseGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float gi = g[i] + l2 * w[i];
      w[i] *= decoupled;
      m[i] = b1 * m[i] + one_minus_b1 * gi;
      v[i] = b2 * v[i] + one_minus_b2 * gi * gi;
      w[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps);
    }
  });
  s.exp_avg.bump_version();
  s.exp_avg_sq.bump_version();
  return ParamCopy::kNeeded;
}

}  // namespace ampgrad::optim
