// nn modules: Module (parameters, forward, to), Linear, ReLU, Sequential.
#pragma once

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "framework/error.h"
#include "framework/tensor.h"

namespace ampgrad::nn {

/// A layer or model: forward(x) and the parameters it owns. Modules are handles too: copying
/// one shares its parameters.
class Module {
 public:
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }
  /// Every parameter with its name, in a fixed order: "weight", "bias", "0.weight", ... (the
  /// names PyTorch's state_dict gives the same architecture).
  virtual std::vector<std::pair<std::string, Tensor>> named_parameters() const { return {}; }
  /// The parameters alone, in the same order (what optimizers take).
  std::vector<Tensor> parameters() const;
  /// Converts every parameter in place: the Tensor handles already given out stay valid
  /// (gradients are cleared). Do this before building an optimizer over the parameters.
  Module& to(DType dtype);
  Module& to(Device device);
};

/// Whether a Linear layer has a bias.
enum class Bias : bool { kNo, kYes };

/// y = x W^T + b; W [out, in] Kaiming-uniform, b [out] uniform in +-1/sqrt(in) (PyTorch's init).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, Bias bias = Bias::kYes);
  Tensor forward(const Tensor& x) override;
  std::vector<std::pair<std::string, Tensor>> named_parameters() const override;

  Tensor weight;
  Tensor bias;  // undefined with Bias::kNo
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

/// Runs its modules in order: Sequential model{Linear(10, 64), ReLU(), Linear(64, 1)}.
class Sequential : public Module {
 public:
  template <typename... Modules>
    requires(std::is_base_of_v<Module, std::decay_t<Modules>> && ...)
  explicit Sequential(Modules&&... modules) {
    (push_back(std::forward<Modules>(modules)), ...);
  }

  template <typename M>
  void push_back(M&& module) {
    modules_.push_back(std::make_shared<std::decay_t<M>>(std::forward<M>(module)));
  }

  Tensor forward(const Tensor& x) override;
  std::vector<std::pair<std::string, Tensor>> named_parameters() const override;
  size_t size() const { return modules_.size(); }
  Module& operator[](size_t index) {
    AG_CHECK(index < modules_.size(), "Sequential[", index, "]: out of range for ", modules_.size(), " modules");
    return *modules_[index];
  }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace ampgrad::nn
