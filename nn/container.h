// Containers: ModuleList (numbered children, no forward) and Sequential (runs them in order).
// They hold the modules they are given, not copies: a module passed twice is one module, tied.
#pragma once

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "framework/error.h"
#include "nn/module.h"

namespace ampgrad::nn {

class ModuleList;

template <typename T>
struct IsModulePtr : std::false_type {};
template <typename M>
struct IsModulePtr<std::shared_ptr<M>> : std::is_base_of<Module, M> {};

/// A module handle (Linear(4, 8), a variable) or a std::shared_ptr to a module.
template <typename T>
concept ModuleArg = std::is_base_of_v<Module, std::decay_t<T>> || IsModulePtr<std::decay_t<T>>::value;

/// Children named "0", "1", ... (PyTorch's nn.ModuleList): `blocks.0.attn.weight`.
class ModuleList : public Module {
 public:
  ModuleList() = default;
  /// Holds each given module. One container as the only argument is a copy of that handle (as
  /// copy construction); to nest it, push_back it into an empty one.
  template <ModuleArg... Ms>
    requires(sizeof...(Ms) > 0 && !(sizeof...(Ms) == 1 && (std::is_base_of_v<ModuleList, std::decay_t<Ms>> && ...)))
  explicit ModuleList(Ms&&... modules) {
    (push_back(std::forward<Ms>(modules)), ...);
  }

  /// Appends a module (a handle: the list holds that same module) under the next number.
  template <typename M>
    requires std::is_base_of_v<Module, M>
  void push_back(M module) {
    register_module(std::to_string(size()), std::move(module));
  }
  /// Appends a module already held elsewhere, shared (the same module may sit in several places).
  template <typename M>
    requires std::is_base_of_v<Module, M>
  void push_back(std::shared_ptr<M> module) {
    register_module(std::to_string(size()), std::move(module));
  }

  /// The number of modules held.
  size_t size() const { return named_children().size(); }
  /// The module at `index` (as a Module).
  Module& operator[](size_t index) const { return *ptr(index); }
  /// The module at `index` as a shared pointer; throws when out of range.
  std::shared_ptr<Module> ptr(size_t index) const;
  /// The module at `index` as its own type: blocks.at<Block>(0).attn.
  template <typename M>
  M& at(size_t index) const {
    auto* typed = dynamic_cast<M*>(ptr(index).get());
    AG_CHECK(typed != nullptr, type_name(), "::at(", index, "): the module is a ", (*this)[index].type_name(),
             ", not the type asked for");
    return *typed;
  }
};

/// Runs its modules in order: Sequential model{Linear(10, 64), ReLU(), Linear(64, 1)};
/// names "0.weight", "0.bias", "2.weight", ... as PyTorch's nn.Sequential.
class Sequential : public ModuleList {
 public:
  /// Built from modules as ModuleList is: Sequential{Linear(10, 64), ReLU(), Linear(64, 1)}.
  using ModuleList::ModuleList;
  Tensor forward(const Tensor& x) override;
};

}  // namespace ampgrad::nn
