// ForwardWatch: hooks that remember the first module whose output held inf/NaN.
#include "amp/diagnostics/forward_watch.h"

#include "amp/unscale.h"
#include "framework/autograd.h"

namespace ampgrad::amp {

ForwardWatch::ForwardWatch(nn::Module& model) : first_(std::make_shared<std::optional<std::string>>()) {
  for (const auto& [name, module] : model.named_modules()) {
    // The hook shares `first_`, so it stays safe if the module outlives the watch's removal.
    const int64_t id = module->register_forward_hook(
        [first = first_, name = name](nn::Module&, const Tensor&, const Tensor& output) {
          if (first->has_value() || !GradMode::is_enabled()) return;
          if (any_nonfinite(output)) *first = name;
        });
    hooks_.emplace_back(*module, id);
  }
}

ForwardWatch::~ForwardWatch() {
  for (auto& [module, id] : hooks_) module.remove_forward_hook(id);
}

}  // namespace ampgrad::amp
