// The tape: ops that see inputs requiring grad record a Node (inputs, saved tensors, backward);
// backward() replays the recorded nodes reachable from the loss in reverse recording order.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "framework/tensor.h"

namespace ampgrad {

/// Thread-local switch for recording; NoGradGuard turns it off for a scope.
class GradMode {
 public:
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

/// RAII: nothing is recorded while it lives (restores the previous mode on exit).
class NoGradGuard {
 public:
  NoGradGuard() : previous_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

/// Tensors an op keeps for its backward. Stored detached (values only, so no reference cycle
/// through the output's grad_fn), with the storage version at save time so that an in-place
/// change before backward is an error rather than a silently wrong gradient. Released after
/// backward unless the graph is retained.
class SavedTensors {
 public:
  explicit SavedTensors(std::string_view op_name) : op_name_(op_name) {}
  void save(const Tensor& tensor);
  const Tensor& operator[](size_t index) const;  // throws once released or modified in place
  void release();
  /// Whether the op's input `index` needs a gradient (backward may skip the others).
  bool needs_grad(size_t index) const { return index < needs_grad_.size() && needs_grad_[index]; }
  void set_needs_grad(std::vector<bool> needs_grad) { needs_grad_ = std::move(needs_grad); }

 private:
  std::string_view op_name_;
  std::vector<Tensor> tensors_;
  std::vector<uint64_t> versions_;
  std::vector<bool> needs_grad_;
  bool released_ = false;
};

/// Where an input's gradient goes: the node that produced it, or the leaf that accumulates it.
struct Edge {
  std::shared_ptr<Node> node;
  std::shared_ptr<TensorImpl> leaf;
};

/// One recorded op. backward() maps the gradient of its output to one gradient per input
/// (undefined where the input needs none), each in that input's dtype and shape.
class Node {
 public:
  Node();
  virtual ~Node() = default;
  virtual std::string_view name() const = 0;
  virtual std::vector<Tensor> backward(const Tensor& grad_output) = 0;
  virtual void release_saved() = 0;

  uint64_t sequence_nr() const { return sequence_nr_; }
  std::vector<Edge> next_edges;

 private:
  uint64_t sequence_nr_;  // position on this thread's tape: replay order is descending
};

/// Edge for one op input: its grad_fn, itself if it is a leaf requiring grad, else empty.
Edge edge_to(const Tensor& input);

/// Runs backward from `root` (see Tensor::backward).
void run_backward(const Tensor& root, const Tensor& grad, RetainGraph retain);

}  // namespace ampgrad
