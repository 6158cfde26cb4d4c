// nn module implementations.
#include "nn/module.h"

#include <cmath>

#include "framework/autograd.h"
#include "framework/error.h"
#include "ops/ops.h"

namespace ampgrad::nn {

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, p] : named_parameters()) out.push_back(p);
  return out;
}

Module& Module::to(DType dtype) {
  for (Tensor& p : parameters()) p.set_data(p.detach().to(dtype));
  return *this;
}

Module& Module::to(Device device) {
  for (Tensor& p : parameters()) p.set_data(p.detach().to(device));
  return *this;
}

Linear::Linear(int64_t in_features, int64_t out_features, Bias has_bias) {
  AG_CHECK(in_features > 0 && out_features > 0, "nn::Linear(", in_features, ", ", out_features,
           "): feature counts must be positive");
  // kaiming_uniform_(a = sqrt(5)) gives bound = sqrt(6 / ((1 + a^2) fan_in)) = 1 / sqrt(fan_in).
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  weight = uniform({out_features, in_features}, -bound, bound);
  weight.set_requires_grad(true);
  if (has_bias == Bias::kYes) {
    bias = uniform({out_features}, -bound, bound);
    bias.set_requires_grad(true);
  }
}

Tensor Linear::forward(const Tensor& x) { return ops::linear(x, weight, bias); }

std::vector<std::pair<std::string, Tensor>> Linear::named_parameters() const {
  if (bias.defined()) return {{"weight", weight}, {"bias", bias}};
  return {{"weight", weight}};
}

Tensor ReLU::forward(const Tensor& x) { return ops::relu(x); }

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (const auto& module : modules_) h = module->forward(h);
  return h;
}

std::vector<std::pair<std::string, Tensor>> Sequential::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> all;
  for (size_t i = 0; i < modules_.size(); ++i) {
    for (auto& [name, p] : modules_[i]->named_parameters()) all.emplace_back(std::to_string(i) + "." + name, p);
  }
  return all;
}

}  // namespace ampgrad::nn
