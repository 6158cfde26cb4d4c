// nn::Module: the shared registries and the traversals every module gets from them.
#include "nn/module.h"

#include <cxxabi.h>

#include <cstdlib>
#include <deque>
#include <functional>
#include <typeinfo>
#include <unordered_set>

#include "framework/error.h"

namespace ampgrad::nn {

// Parameters and buffers sit in deques: Tensor& handed out by register_* stay valid as more are
// added (a vector would move them).
struct Module::State {
  std::deque<std::pair<std::string, Tensor>> parameters;
  std::deque<std::pair<std::string, Tensor>> buffers;
  Named<std::shared_ptr<Module>> children;
  bool training = true;
  std::vector<std::pair<int64_t, ForwardHook>> forward_hooks;
  int64_t next_hook_id = 1;
};

Module::Module() : state_(std::make_shared<State>()) {}

std::string Module::type_name() const {
  int status = 0;
  char* demangled = abi::__cxa_demangle(typeid(*this).name(), nullptr, nullptr, &status);
  std::string out = status == 0 && demangled != nullptr ? demangled : typeid(*this).name();
  std::free(demangled);
  return out;
}

Tensor Module::forward(const Tensor&) {
  AG_FAIL(type_name(), "::forward: this module has no forward(x); hint: a ModuleList is a container, call its ",
          "modules; a custom module overrides Tensor forward(const Tensor& x)");
}

Tensor Module::operator()(const Tensor& x) {
  Tensor out = forward(x);
  if (!state_->forward_hooks.empty()) {
    // A copy: a hook may add or remove hooks.
    const std::vector<std::pair<int64_t, ForwardHook>> hooks = state_->forward_hooks;
    for (const auto& [id, hook] : hooks) hook(*this, x, out);
  }
  return out;
}

int64_t Module::register_forward_hook(ForwardHook hook) {
  AG_CHECK(hook != nullptr, type_name(), "::register_forward_hook: the hook is empty");
  const int64_t id = state_->next_hook_id++;
  state_->forward_hooks.emplace_back(id, std::move(hook));
  return id;
}

void Module::remove_forward_hook(int64_t id) {
  std::erase_if(state_->forward_hooks, [id](const auto& entry) { return entry.first == id; });
}

void Module::check_new_name(const std::string& name, const char* what) const {
  AG_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name(), "::", what, "(\"", name,
           "\"): a name must be non-empty and have no '.' (dots join the names of nested modules)");
  auto taken = [&](const auto& entries) {
    for (const auto& entry : entries) {
      if (entry.first == name) return true;
    }
    return false;
  };
  AG_CHECK(!taken(state_->parameters) && !taken(state_->buffers) && !taken(state_->children), type_name(), "::",
           what, "(\"", name, "\"): the module already has a parameter, buffer or child named '", name, "'");
}

Tensor& Module::register_parameter(const std::string& name, Tensor tensor, RequiresGrad requires_grad) {
  check_new_name(name, "register_parameter");
  if (tensor.defined()) {
    AG_CHECK(tensor.is_leaf(), type_name(), "::register_parameter(\"", name, "\"): ", tensor.to_string(),
             " was produced by an op; hint: register a leaf, e.g. t.detach()");
    tensor.set_requires_grad(requires_grad == RequiresGrad::kYes);
  }
  return state_->parameters.emplace_back(name, std::move(tensor)).second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor tensor) {
  check_new_name(name, "register_buffer");
  return state_->buffers.emplace_back(name, std::move(tensor)).second;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> child) {
  check_new_name(name, "register_module");
  AG_CHECK(child != nullptr, type_name(), "::register_module(\"", name, "\"): the module is null");
  // A module inside itself would make every traversal endless (and the shared states a leak).
  for (const auto& [inner_name, inner] : child->named_modules()) {
    AG_CHECK(!inner->is_same(*this), type_name(), "::register_module(\"", name, "\"): ", child->type_name(),
             " contains this module", inner_name.empty() ? "" : " at '" + inner_name + "'",
             "; a module cannot be its own descendant");
  }
  state_->children.emplace_back(name, std::move(child));
}

namespace {

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// What walk() does with a module it reaches a second time (tied, shared).
enum class Repeats : bool { kSkip, kVisit };

// Calls visit(prefix, module) for `root` and its descendants, depth first. With Repeats::kSkip, a
// module reached again is skipped with its subtree, as PyTorch's named_modules() does.
void walk(Module& root, Repeats repeats, const std::function<void(const std::string&, Module&)>& visit) {
  std::vector<const Module*> seen;
  std::function<void(const std::string&, Module&)> go = [&](const std::string& prefix, Module& m) {
    if (repeats == Repeats::kSkip) {
      for (const Module* s : seen) {
        if (s->is_same(m)) return;
      }
      seen.push_back(&m);
    }
    visit(prefix, m);
    for (const auto& [name, child] : m.named_children()) go(join(prefix, name), *child);
  };
  go("", root);
}

// Appends the defined tensors of `entries` under prefix, once each when `seen` is given.
void collect(const std::string& prefix, const std::deque<std::pair<std::string, Tensor>>& entries,
             std::unordered_set<const TensorImpl*>* seen, Named<Tensor>& out) {
  for (const auto& [name, t] : entries) {
    if (!t.defined()) continue;
    if (seen != nullptr && !seen->insert(t.impl()).second) continue;
    out.emplace_back(join(prefix, name), t);
  }
}

}  // namespace

// The traversals take `this` as non-const only to walk it; none of them changes the module.
Named<Tensor> Module::named_parameters() const {
  Named<Tensor> out;
  std::unordered_set<const TensorImpl*> seen;
  walk(const_cast<Module&>(*this), Repeats::kSkip,
       [&](const std::string& prefix, Module& m) { collect(prefix, m.state_->parameters, &seen, out); });
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, p] : named_parameters()) out.push_back(p);
  return out;
}

Named<Tensor> Module::named_buffers() const {
  Named<Tensor> out;
  std::unordered_set<const TensorImpl*> seen;
  walk(const_cast<Module&>(*this), Repeats::kSkip,
       [&](const std::string& prefix, Module& m) { collect(prefix, m.state_->buffers, &seen, out); });
  return out;
}

std::vector<Tensor> Module::buffers() const {
  std::vector<Tensor> out;
  for (auto& [name, b] : named_buffers()) out.push_back(b);
  return out;
}

Named<Tensor> Module::state_dict() const {
  Named<Tensor> out;
  walk(const_cast<Module&>(*this), Repeats::kVisit, [&](const std::string& prefix, Module& m) {
    collect(prefix, m.state_->parameters, nullptr, out);
    collect(prefix, m.state_->buffers, nullptr, out);
  });
  return out;
}

const Named<std::shared_ptr<Module>>& Module::named_children() const { return state_->children; }

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [name, child] : state_->children) out.push_back(child);
  return out;
}

Named<Module*> Module::named_modules() {
  Named<Module*> out;
  walk(*this, Repeats::kSkip, [&](const std::string& prefix, Module& m) { out.emplace_back(prefix, &m); });
  return out;
}

Module& Module::train() {
  for (auto& [name, m] : named_modules()) m->state_->training = true;
  return *this;
}

Module& Module::eval() {
  for (auto& [name, m] : named_modules()) m->state_->training = false;
  return *this;
}

bool Module::is_training() const { return state_->training; }

namespace {

// Every parameter and buffer once, so a tied tensor is converted once and stays tied.
std::vector<Tensor> unique_tensors(const Module& m) {
  std::vector<Tensor> out = m.parameters();
  std::unordered_set<const TensorImpl*> seen;
  for (const Tensor& p : out) seen.insert(p.impl());
  for (const Tensor& b : m.buffers()) {
    if (seen.insert(b.impl()).second) out.push_back(b);
  }
  return out;
}

}  // namespace

Module& Module::to(DType dtype) {
  AG_CHECK(is_floating(dtype), type_name(), "::to(", dtype_name(dtype), "): a module converts to a floating dtype ",
           "only, as PyTorch's; hint: an int64 buffer keeps its dtype through to(float16)");
  for (Tensor& t : unique_tensors(*this)) {
    if (is_floating(t.dtype())) t.set_data(t.detach().to(dtype));  // int64 ids and counters stay as they are
  }
  return *this;
}

Module& Module::to(Device device) {
  for (Tensor& t : unique_tensors(*this)) t.set_data(t.detach().to(device));
  return *this;
}

}  // namespace ampgrad::nn
