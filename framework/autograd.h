// The tape: ops that see inputs requiring grad record a Node (inputs, saved tensors, backward);
// backward() replays the recorded nodes reachable from the loss in reverse recording order.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "framework/tensor.h"

namespace ampgrad {

struct Storage;

namespace detail {
struct Captures;  // grad()'s targets and their gradients
/// backward() and grad(): one pass over the graph of `root` (autograd.cc).
void backward_pass(const Tensor& root, const Tensor& grad, RetainGraph retain, Captures* captures);
}  // namespace detail

/// Thread-local switch for recording; NoGradGuard turns it off for a scope.
class GradMode {
 public:
  /// Whether ops run now are recorded on the tape (true unless a NoGradGuard is alive).
  static bool is_enabled();
  /// Turns recording on or off for this thread.
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

/// Tensors an op keeps for its backward: its inputs (an op must not save its own output, which
/// would be a reference cycle through the output's grad_fn). Each is kept with its storage and
/// that storage's version at save time, so that an in-place change (or a set_data) before
/// backward is an error rather than a silently wrong gradient. Held inline, without heap
/// allocations: a small training step records a handful of these every step. Released after
/// backward unless the graph is retained.
class SavedTensors {
 public:
  static constexpr size_t kMaxSaved = 4;  ///< tensors an op may save
  static constexpr size_t kMaxInputs = 32;  ///< inputs an op may have (needs_grad's bits)

  /// An empty set for the op named op_name (the name goes into its errors).
  explicit SavedTensors(std::string_view op_name) : op_name_(op_name) {}
  /// Keeps `tensor` and its storage's version (at most kMaxSaved).
  void save(const Tensor& tensor);
  const Tensor& operator[](size_t index) const;  ///< throws once released or modified in place
  /// Drops every saved tensor (after backward, unless the graph is retained).
  void release();
  /// Whether the op's input `index` needs a gradient (backward may skip the others).
  bool needs_grad(size_t index) const { return index < kMaxInputs && ((needs_grad_ >> index) & 1u) != 0; }
  /// Marks the op's input `index` as needing a gradient.
  void set_needs_grad(size_t index) { needs_grad_ |= uint32_t{1} << index; }
  /// Throws if `output` (the op's result) was saved: that would be a reference cycle.
  void check_not_saved(const Tensor& output) const;

 private:
  struct Entry {
    Tensor tensor;
    std::shared_ptr<Storage> storage;  // the storage it had when saved
    uint64_t version = 0;
  };
  std::string_view op_name_;
  std::array<Entry, kMaxSaved> entries_;
  size_t count_ = 0;
  uint32_t needs_grad_ = 0;  // bit i: input i needs a gradient
  bool released_ = false;
};

/// Where an input's gradient goes: the node that produced it, or the leaf that accumulates it.
struct Edge {
  std::shared_ptr<Node> node;  ///< the node that produced the input (null for a leaf)
  std::shared_ptr<TensorImpl> leaf;  ///< the leaf that accumulates the gradient (null for a produced input)
};

/// One recorded op. backward() maps the gradient of its output to one gradient per input
/// (undefined where the input needs none), each in that input's dtype and shape.
class Node {
 public:
  Node();
  /// Hands the inputs' nodes to release_node, so that freeing a long chain never recurses.
  virtual ~Node();
  /// The op's name, for errors and the anomaly trace.
  virtual std::string_view name() const = 0;
  /// One gradient per input from the gradient of the output.
  virtual std::vector<Tensor> backward(const Tensor& grad_output) = 0;
  /// Frees the tensors saved for backward.
  virtual void release_saved() = 0;

  /// Recording order on this thread's tape (backward replays in descending order).
  uint64_t sequence_nr() const { return sequence_nr_; }
  std::vector<Edge> next_edges;  ///< one per input of the op, in order

 private:
  friend void detail::backward_pass(const Tensor& root, const Tensor& grad, RetainGraph retain,
                                    detail::Captures* captures);

  uint64_t sequence_nr_;  // position on this thread's tape: replay order is descending
  // Scratch of the backward pass running through this node (kept here rather than in hash maps,
  // which cost two heap allocations per node per step). So one graph must not be backpropagated
  // by two threads at once, and backward formulas must not call backward themselves.
  Tensor pending_grad_;        // the gradient of this node's output summed so far
  uint64_t visited_pass_ = 0;  // the last backward pass that reached this node
};

/// A leaf's post-accumulate-grad hooks (Tensor::register_post_accumulate_grad_hook), by id.
struct PostAccumulateGradHooks {
  std::vector<std::pair<uint64_t, PostAccumulateGradHook>> hooks;  ///< (id, hook) in registration order
  uint64_t next_id = 1;  ///< the id the next hook gets
};

namespace detail {
void release_last_owner(std::shared_ptr<Node>& node) noexcept;  // release_node's slow path
}  // namespace detail

/// Lets go of `node`. If that was its last owner, the node is freed, and with it every node only
/// it held, iteratively: a node's destructor queues its inputs' nodes on this thread's release
/// in progress instead of freeing them inside its own destructor (as PyTorch's deleteNode), so a
/// chain of a million ops is freed in constant stack depth. Leaves `node` empty. Inline: every
/// TensorImpl destructor calls it, nearly always with no node or a shared one.
inline void release_node(std::shared_ptr<Node>& node) noexcept {
  if (node == nullptr) return;
  // use_count() == 1 is exact here: no other owner exists that could take a new reference. When
  // it is more, another thread may still drop its reference first, and this reset then frees the
  // node: its destructor queues its inputs, so that too is one level deep.
  if (node.use_count() > 1) return node.reset();
  detail::release_last_owner(node);
}

/// Edge for one op input: its grad_fn, itself if it is a leaf requiring grad, else empty.
Edge edge_to(const Tensor& input);

/// Runs backward from `root` (see Tensor::backward). A node's backward may run a pass of its own
/// over another graph (activation checkpointing's recompute does).
void run_backward(const Tensor& root, const Tensor& grad, RetainGraph retain);

/// The gradients of `root` (seeded with grad_output, as backward(grad)) with respect to `leaves`,
/// returned instead of accumulated (torch.autograd.grad with leaf inputs): no leaf's .grad changes
/// and no hook runs; a leaf the graph does not reach gets an undefined tensor. The graph is
/// released as by backward().
std::vector<Tensor> grad(const Tensor& root, const Tensor& grad_output, const std::vector<Tensor>& leaves);

/// grad() for targets given as edges: Edge{.leaf} for a leaf, Edge{.node} for a node, whose
/// gradient is that of its output; the pass stops at a node target (it is not run, nor anything
/// only it leads to). A returned gradient may alias grad_output (an identity graph). Activation
/// checkpointing takes its function's gradients so, stopping where the function read a tensor
/// that carries a graph of its own.
std::vector<Tensor> edge_grads(const Tensor& root, const Tensor& grad_output, const std::vector<Edge>& targets);

/// The sequence number the next recorded node will get: nodes numbered below it were recorded
/// before now.
uint64_t next_sequence_nr();

/// Walks the graph below `root` as a backward would reach it, each node once (depth first):
/// visit(node, i) is called for each edge i of each node reached, and the walk goes on into that
/// edge's node when it returns true.
void walk_graph(const Node& root, const std::function<bool(const Node&, size_t)>& visit);

/// The leaves that a backward from `root` reaches, in the order it first writes their gradients:
/// it replays nodes by descending sequence_nr, and a leaf is first written by the first of its
/// consumers to run. Reads only the graph's edges, which a backward keeps, so it may be called
/// before or after one; the pointers are valid while the graph lives. For reports (a skipped
/// step lists its inf/NaN gradients in this order); the engine itself does not use it.
std::vector<const TensorImpl*> leaves_in_backward_order(const Tensor& root);

}  // namespace ampgrad
