// checkpoint(): the forward runs fn once with recording on, notes which leaves its graph reaches
// (the parameters), and lets that graph go; what stays is one node whose edges are the inputs'
// and those leaves'. Its backward re-runs fn in the forward's autocast and random state and takes
// the gradients of that recomputation with grad(), which returns them instead of accumulating, so
// the outer backward accumulates each parameter's gradient itself (once per checkpoint call, in
// its replay order), with its hooks and its count of pending edges intact.
#include "utils/activation_checkpoint.h"

#include <array>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>

#include "framework/autocast.h"
#include "framework/autograd.h"
#include "framework/error.h"
#include "framework/random.h"
#include "framework/tensor_impl.h"

namespace ampgrad::utils {

namespace {

constexpr std::array<Device, 2> kDevices{Device::kCPU, Device::kCUDA};

// The leaves fn starts from: each input detached (the same storage), with its requires_grad.
std::vector<Tensor> leaves_for(const std::vector<Tensor>& inputs) {
  std::vector<Tensor> leaves;
  leaves.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    if (!t.defined()) {
      leaves.emplace_back();
      continue;
    }
    Tensor leaf = t.detach();
    if (t.requires_grad()) leaf.set_requires_grad(true);
    leaves.push_back(leaf);
  }
  return leaves;
}

// The leaves a backward from `root` reaches other than `own` (fn's input leaves), in the order a
// depth-first walk of the graph meets them: the same order for the same graph.
std::vector<std::shared_ptr<TensorImpl>> reached_leaves(const Tensor& root, const std::vector<Tensor>& own) {
  std::unordered_set<const TensorImpl*> skip;
  for (const Tensor& t : own) {
    if (t.defined()) skip.insert(t.impl());
  }
  std::vector<std::shared_ptr<TensorImpl>> leaves;
  if (!root.grad_fn()) return leaves;
  std::unordered_set<const Node*> seen{root.grad_fn().get()};
  std::vector<const Node*> stack{root.grad_fn().get()};
  while (!stack.empty()) {
    const Node* node = stack.back();
    stack.pop_back();
    for (const Edge& edge : node->next_edges) {
      if (edge.leaf) {
        if (skip.insert(edge.leaf.get()).second) leaves.push_back(edge.leaf);
      } else if (edge.node && seen.insert(edge.node.get()).second) {
        stack.push_back(edge.node.get());
      }
    }
  }
  return leaves;
}

// The state fn ran in: the random generator and every device's autocast switch.
struct ForwardState {
  std::string rng;
  std::array<autocast::State, kDevices.size()> autocast{};

  static ForwardState now() {
    ForwardState s{random::get_state(), {}};
    for (size_t i = 0; i < kDevices.size(); ++i) s.autocast[i] = autocast::state(kDevices[i]);
    return s;
  }
};

// Puts a ForwardState in place (recording on, an autocast region open for the cast cache) and
// puts the previous one back on exit, exceptions included.
class RestoredState {
 public:
  explicit RestoredState(const ForwardState& state) : previous_(ForwardState::now()), grad_mode_(GradMode::is_enabled()) {
    random::set_state(state.rng);
    for (size_t i = 0; i < kDevices.size(); ++i) autocast::set_state(kDevices[i], state.autocast[i]);
    autocast::enter_region();
    GradMode::set_enabled(true);
  }
  ~RestoredState() {
    GradMode::set_enabled(grad_mode_);
    autocast::exit_region();
    for (size_t i = 0; i < kDevices.size(); ++i) autocast::set_state(kDevices[i], previous_.autocast[i]);
    random::set_state(previous_.rng);
  }
  RestoredState(const RestoredState&) = delete;
  RestoredState& operator=(const RestoredState&) = delete;

 private:
  ForwardState previous_;
  bool grad_mode_;
};

class CheckpointNode final : public Node {
 public:
  CheckpointNode(CheckpointFn fn, const std::vector<Tensor>& inputs, ForwardState state)
      : fn_(std::move(fn)), inputs_(inputs), state_(std::move(state)) {
    for (const Tensor& t : inputs_) input_values_.push_back(Values::of(t));
  }

  // Called once fn's graph is known: the edges after the inputs' go to these leaves.
  void set_reached(std::vector<std::shared_ptr<TensorImpl>> reached) {
    for (const auto& leaf : reached) reached_values_.push_back(Values::of(Tensor(leaf)));
    reached_ = std::move(reached);
  }

  std::string_view name() const override { return "checkpoint"; }

  std::vector<Tensor> backward(const Tensor& grad_output) override {
    AG_CHECK(fn_, "checkpoint: backward through a graph already released; hint: pass RetainGraph::kYes to the ",
             "first backward to run another");
    for (size_t i = 0; i < inputs_.size(); ++i) {
      AG_CHECK(Values::of(inputs_[i]) == input_values_[i], "checkpoint: input ", i, " (", inputs_[i].to_string(),
               ") was modified in place after the forward, so the recomputation would not see the values the ",
               "forward saw; hint: modify a copy, or modify it after backward()");
    }
    for (size_t i = 0; i < reached_.size(); ++i) {
      AG_CHECK(Values::of(Tensor(reached_[i])) == reached_values_[i], "checkpoint: ", Tensor(reached_[i]).to_string(),
               ", which fn reads, was modified in place after the forward (an optimizer step before backward?)");
    }
    std::vector<Tensor> leaves;
    Tensor y;
    {
      RestoredState state(state_);
      leaves = leaves_for(inputs_);
      y = fn_(leaves);
    }
    AG_CHECK(y.defined() && y.shape() == grad_output.shape() && y.dtype() == grad_output.dtype(),
             "checkpoint: the recomputation returned ", y.defined() ? y.to_string() : std::string("nothing"),
             " where the forward returned ", grad_output.to_string(), "; hint: fn must compute the same thing twice");
    const std::vector<std::shared_ptr<TensorImpl>> again = reached_leaves(y, leaves);
    AG_CHECK(again == reached_, "checkpoint: the recomputation reads ", again.size(), " tensors that require grad ",
             "besides the inputs where the forward read ", reached_.size(), " (or other ones); hint: fn must not ",
             "branch on values that change between the forward and the backward");

    // Targets: the input leaves that require grad, then the reached leaves (the node's edge order).
    std::vector<Tensor> targets;
    std::vector<size_t> slot_of_target;
    for (size_t i = 0; i < leaves.size(); ++i) {
      if (leaves[i].defined() && leaves[i].requires_grad()) {
        targets.push_back(leaves[i]);
        slot_of_target.push_back(i);
      }
    }
    for (size_t i = 0; i < reached_.size(); ++i) {
      targets.emplace_back(reached_[i]);
      slot_of_target.push_back(inputs_.size() + i);
    }
    std::vector<Tensor> grads = grad(y, grad_output, targets);
    std::vector<Tensor> result(inputs_.size() + reached_.size());
    for (size_t i = 0; i < grads.size(); ++i) result[slot_of_target[i]] = std::move(grads[i]);
    return result;
  }

  void release_saved() override {
    fn_ = nullptr;
    inputs_.clear();
    input_values_.clear();
    reached_values_.clear();
  }

 private:
  // What a tensor held when the forward read it: its storage and that storage's version (an
  // in-place write bumps the version, set_data swaps the storage).
  struct Values {
    std::shared_ptr<Storage> storage;  // held, so a freed storage's address cannot come back
    uint64_t version = 0;
    static Values of(const Tensor& t) { return t.defined() ? Values{t.impl()->storage, t.version()} : Values{}; }
    bool operator==(const Values&) const = default;
  };

  CheckpointFn fn_;
  std::vector<Tensor> inputs_;
  std::vector<Values> input_values_;
  std::vector<std::shared_ptr<TensorImpl>> reached_;
  std::vector<Values> reached_values_;
  ForwardState state_;
};

}  // namespace

Tensor checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs) {
  AG_CHECK(fn, "checkpoint: fn is empty");
  if (!GradMode::is_enabled()) return fn(inputs);
  ForwardState state = ForwardState::now();
  const std::vector<Tensor> leaves = leaves_for(inputs);
  Tensor y = fn(leaves);
  AG_CHECK(y.defined(), "checkpoint: fn returned an undefined tensor");
  if (!y.requires_grad()) return y;  // nothing to differentiate: there is no graph to save

  auto node = std::make_shared<CheckpointNode>(fn, inputs, std::move(state));
  std::vector<std::shared_ptr<TensorImpl>> reached = reached_leaves(y, leaves);
  node->next_edges.reserve(inputs.size() + reached.size());
  for (const Tensor& t : inputs) node->next_edges.push_back(edge_to(t));
  for (const auto& leaf : reached) node->next_edges.push_back({.node = nullptr, .leaf = leaf});
  node->set_reached(std::move(reached));
  // y's values without its graph: fn's saved activations are freed when y goes here.
  Tensor out = y.detach();
  out.impl()->requires_grad = true;
  out.impl()->grad_fn = std::move(node);
  return out;
}

}  // namespace ampgrad::utils
