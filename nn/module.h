// nn::Module, the base of every layer and model. A module is a handle: its registered parameters,
// buffers, children and training flag live in one shared state, so a copy is the same module.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "framework/tensor.h"

namespace ampgrad::nn {

/// Whether a registered parameter is trained (kNo: a frozen parameter).
enum class RequiresGrad : bool { kNo, kYes };

/// Values with the names a module tree gives them ("0.weight", "blocks.0.attn"), in traversal order.
template <typename T>
using Named = std::vector<std::pair<std::string, T>>;

/// A layer or model. Subclasses register what they own in their constructor (as libtorch's
/// register_parameter / register_buffer / register_module) and implement forward(x); names,
/// traversal, to(), train()/eval() and checkpoints then come from the registries.
class Module {
 public:
  Module();
  /// The copy is the same module: registered parameters, buffers, children and the training
  /// flag are shared (what Sequential{lin} relies on). Plain data members of a subclass are copied.
  Module(const Module& other) = default;
  /// Deleted: assigning would rebind one handle and silently leave the others on the old module.
  Module& operator=(const Module&) = delete;
  virtual ~Module() = default;

  /// The module's computation. The default throws (a ModuleList, for one, has none).
  virtual Tensor forward(const Tensor& x);
  /// forward(x), then the forward hooks. Containers run their children this way.
  Tensor operator()(const Tensor& x);

  /// hook(module, input, output), called after each forward run through operator() (PyTorch's
  /// register_forward_hook), e.g. to look for inf/NaN in activations.
  using ForwardHook = std::function<void(Module& module, const Tensor& input, const Tensor& output)>;
  /// Adds a hook, shared by every handle of the module; returns an id for remove_forward_hook.
  int64_t register_forward_hook(ForwardHook hook);
  /// Removes a hook by id (an unknown or already removed id is ignored).
  void remove_forward_hook(int64_t id);

  // Registration. A name is non-empty, has no '.', and is unique among the module's parameters,
  // buffers and children. The returned reference stays valid while any handle to the module
  // lives: keep it as a `Tensor&` member, and assigning through it reaches every handle.
  /// An undefined tensor reserves the name (as an absent bias) and is skipped by traversals.
  Tensor& register_parameter(const std::string& name, Tensor tensor, RequiresGrad requires_grad = RequiresGrad::kYes);
  /// State that is saved and converted by to() but not trained (running statistics, masks).
  Tensor& register_buffer(const std::string& name, Tensor tensor);
  /// Adds a child and returns a handle to it: `nn::Linear fc = register_module("fc", nn::Linear(4, 8));`.
  template <typename M>
    requires std::is_base_of_v<Module, M>
  M register_module(const std::string& name, M module) {
    add_child(name, std::make_shared<M>(module));
    return module;
  }
  /// The same for a module held by shared_ptr (a child shared with another parent: tied weights).
  template <typename M>
    requires std::is_base_of_v<Module, M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  // Traversal, depth first in registration order, a module's own entries before its children's.
  /// Each parameter once, under the first name that reaches it: "weight", "0.bias",
  /// "blocks.0.attn.weight" (PyTorch's named_parameters()). A tied parameter appears once.
  Named<Tensor> named_parameters() const;
  /// The parameters of named_parameters(), each once in first-seen order (what optimizers take).
  std::vector<Tensor> parameters() const;
  /// Each buffer once, under the first name that reaches it (running statistics and the like).
  Named<Tensor> named_buffers() const;
  /// The buffers of named_buffers(), each once.
  std::vector<Tensor> buffers() const;
  /// Every parameter and buffer under every name that reaches it, tied ones under each name
  /// (PyTorch's state_dict()): what checkpoints save and load.
  Named<Tensor> state_dict() const;
  /// Direct children in registration order; the same child registered twice appears twice. The
  /// reference is valid until a child is registered.
  const Named<std::shared_ptr<Module>>& named_children() const;
  /// The modules of named_children().
  std::vector<std::shared_ptr<Module>> children() const;
  /// This module (name "") and each descendant once, under its first name. The pointers are
  /// valid while this module lives.
  Named<Module*> named_modules();

  /// Sets the training flag of this module and every descendant (dropout acts only in training).
  Module& train();
  /// Clears the training flag of this module and every descendant (train(false)).
  Module& eval();
  /// Whether this module is in training mode (the default).
  bool is_training() const;

  /// Converts every parameter and buffer once, in place: Tensor handles already given out stay
  /// valid and tied parameters stay tied (gradients are cleared). to(dtype) takes a floating
  /// dtype and converts floating tensors only (int64 buffers keep theirs), as PyTorch's does.
  /// Build optimizers afterwards.
  Module& to(DType dtype);
  /// Moves every parameter and buffer to `device` the same way (build optimizers afterwards).
  Module& to(Device device);

  /// Whether both handles refer to the same module.
  bool is_same(const Module& other) const { return state_ == other.state_; }
  /// The class name ("ampgrad::nn::Linear"), for messages.
  std::string type_name() const;

 private:
  struct State;
  void check_new_name(const std::string& name, const char* what) const;
  void add_child(const std::string& name, std::shared_ptr<Module> child);
  std::shared_ptr<State> state_;
};

}  // namespace ampgrad::nn
