// Forward hooks that look for inf/NaN in every module's output, so that a skipped step can be
// traced to the first module whose activation was already non-finite in the forward.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nn/module.h"

namespace ampgrad::amp {

/// Installs a forward hook on `model` and each of its descendants (named_modules()). While grad
/// mode is on (training forwards; NoGradGuard forwards are ignored), each hook checks its module's
/// output for inf/NaN until one is found, and remembers that module's name. Cost: one read of
/// every module output per training forward (on CUDA also a wait for the GPU per module) until a
/// non-finite one is seen; the hooks are removed when the watch is destroyed.
class ForwardWatch {
 public:
  /// Hooks `model` and its descendants; `model` must outlive the watch.
  explicit ForwardWatch(nn::Module& model);
  ~ForwardWatch();
  ForwardWatch(const ForwardWatch&) = delete;
  ForwardWatch& operator=(const ForwardWatch&) = delete;

  /// The first module (its named_modules() name, "" for the model itself) whose output held
  /// inf/NaN since the last reset(). Hooks run when a module's forward returns, so an inner
  /// module is seen before the module that contains it.
  const std::optional<std::string>& first_nonfinite() const { return *first_; }
  /// Forgets the module seen, so the next non-finite output is recorded.
  void reset() { first_->reset(); }

 private:
  std::shared_ptr<std::optional<std::string>> first_;
  std::vector<std::pair<nn::Module, int64_t>> hooks_;  // module handles (they share its hooks) and hook ids
};

}  // namespace ampgrad::amp
