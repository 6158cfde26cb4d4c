// checkpoint(): the forward runs fn once with recording on and notes where its graph leaves fn:
// the leaves it reaches (parameters) and the nodes recorded before fn ran (tensors fn read that
// carry a graph of their own). It then lets fn's graph go; what stays is one node whose edges are
// the inputs' and those. Its backward re-runs fn in the forward's autocast, attention-backend and
// random state and takes the gradients of that recomputation with edge_grads(), which returns
// them instead of accumulating and stops at those nodes, so the outer backward accumulates each
// parameter's gradient itself (with its hooks and its count of pending edges intact) and runs
// the outside nodes once.
#include "utils/activation_checkpoint.h"

#include <algorithm>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "framework/autocast.h"
#include "framework/autograd.h"
#include "framework/error.h"
#include "framework/float8_scaling.h"
#include "framework/random.h"
#include "framework/tensor_impl.h"
#include "ops/ops.h"

namespace ampgrad::utils {

namespace {

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

bool same_edge(const Edge& a, const Edge& b) { return a.node == b.node && a.leaf == b.leaf; }

// Where a backward from fn's output `root` leaves fn's graph, other than into `own` (fn's input
// leaves): leaves, and nodes numbered below `first_node` (recorded before fn ran), at which the
// walk stops. In the order the engine first writes them (its consumer's sequence number,
// descending, then edge order), so gradients reach them as they would without checkpointing.
std::vector<Edge> exits_of(const Tensor& root, const std::vector<Tensor>& own, uint64_t first_node) {
  std::unordered_set<const TensorImpl*> own_leaves;
  for (const Tensor& t : own) {
    if (t.defined()) own_leaves.insert(t.impl());
  }
  if (!root.requires_grad()) return {};
  if (!root.grad_fn()) {  // fn returned a leaf: one of its inputs, or one it read (a parameter)
    if (own_leaves.count(root.impl()) != 0) return {};
    return {Edge{.node = nullptr, .leaf = root.impl_ptr()}};
  }
  if (root.grad_fn()->sequence_nr() < first_node) return {Edge{.node = root.grad_fn(), .leaf = nullptr}};
  struct Exit {
    Edge edge;
    uint64_t consumer;
    size_t index;
  };
  std::vector<Exit> exits;
  std::unordered_map<const void*, size_t> exit_of;  // leaf or node -> its entry in exits
  walk_graph(*root.grad_fn(), [&](const Node& node, size_t i) {
    const Edge& edge = node.next_edges[i];
    const bool outside_node = edge.node && edge.node->sequence_nr() < first_node;
    const bool outside_leaf = edge.leaf && own_leaves.count(edge.leaf.get()) == 0;
    if (!outside_node && !outside_leaf) return true;  // fn's own node (or input leaf): go on
    const void* key = edge.leaf ? static_cast<const void*>(edge.leaf.get()) : edge.node.get();
    const auto [it, fresh] = exit_of.try_emplace(key, exits.size());
    if (fresh) {
      exits.push_back({edge, node.sequence_nr(), i});
    } else if (node.sequence_nr() > exits[it->second].consumer) {
      exits[it->second].consumer = node.sequence_nr();
      exits[it->second].index = i;
    }
    return false;  // the walk stops where fn's graph ends
  });
  std::sort(exits.begin(), exits.end(), [](const Exit& a, const Exit& b) {
    return a.consumer != b.consumer ? a.consumer > b.consumer : a.index < b.index;
  });
  std::vector<Edge> edges;
  edges.reserve(exits.size());
  for (const Exit& e : exits) edges.push_back(e.edge);
  return edges;
}

// The state fn ran in: the random generator, every device's autocast switch and FP8 region (its
// recipe and step: the recompute casts with the forward's scales) and the attention backend.
struct ForwardState {
  std::string rng;
  std::array<autocast::State, kNumDevices> autocast{};
  std::array<fp8::Region, kNumDevices> fp8{};
  ops::AttentionBackend attention = ops::AttentionBackend::kAuto;

  static ForwardState now() {
    ForwardState s{random::get_state(), {}, {}, ops::attention_backend()};
    for (size_t i = 0; i < kAllDevices.size(); ++i) {
      s.autocast[i] = autocast::state(kAllDevices[i]);
      s.fp8[i] = fp8::region(kAllDevices[i]);
    }
    return s;
  }
};

// Puts a ForwardState in place (recording on, an autocast region open with a cast cache of its
// own) and the previous state back on exit, exceptions included.
class RestoredState {
 public:
  explicit RestoredState(const ForwardState& state)
      : previous_(ForwardState::now()), grad_mode_(GradMode::is_enabled()), attention_(state.attention) {
    random::set_state(state.rng);
    for (size_t i = 0; i < kAllDevices.size(); ++i) {
      autocast::set_state(kAllDevices[i], state.autocast[i]);
      fp8::restore(kAllDevices[i], state.fp8[i]);
    }
    autocast::enter_region();
    GradMode::set_enabled(true);
  }
  ~RestoredState() {
    GradMode::set_enabled(grad_mode_);
    autocast::exit_region();
    for (size_t i = 0; i < kAllDevices.size(); ++i) {
      autocast::set_state(kAllDevices[i], previous_.autocast[i]);
      fp8::restore(kAllDevices[i], previous_.fp8[i]);
    }
    random::set_state(previous_.rng);
  }
  RestoredState(const RestoredState&) = delete;
  RestoredState& operator=(const RestoredState&) = delete;

 private:
  ForwardState previous_;
  bool grad_mode_;
  ops::AttentionBackendGuard attention_;
  autocast::IsolatedCastCache cast_cache_;
};

// What a tensor held when the forward read it: its storage and that storage's version (an
// in-place write bumps the version, set_data swaps the storage).
struct Values {
  std::shared_ptr<Storage> storage;  // held, so a freed storage's address cannot come back
  uint64_t version = 0;
  static Values of(const Tensor& t) { return t.defined() ? Values{t.impl()->storage, t.version()} : Values{}; }
  bool operator==(const Values&) const = default;
};

class CheckpointNode final : public Node {
 public:
  CheckpointNode(CheckpointFn fn, const std::vector<Tensor>& inputs, std::vector<Values> input_values,
                 ForwardState state, std::vector<Edge> exits)
      : fn_(std::move(fn)),
        inputs_(inputs),
        input_values_(std::move(input_values)),
        state_(std::move(state)),
        exits_(std::move(exits)) {
    for (const Edge& e : exits_) exit_values_.push_back(e.leaf ? Values::of(Tensor(e.leaf)) : Values{});
  }

  std::string_view name() const override { return "checkpoint"; }

  std::vector<Tensor> backward(const Tensor& grad_output) override {
    AG_CHECK(fn_, "checkpoint: backward through a graph already released; hint: pass RetainGraph::kYes to the ",
             "first backward to run another");
    for (size_t i = 0; i < inputs_.size(); ++i) {
      AG_CHECK(Values::of(inputs_[i]) == input_values_[i], "checkpoint: input ", i, " (", inputs_[i].to_string(),
               ") was modified in place (by fn or after the forward), so the recomputation would not see the ",
               "values the forward saw; hint: modify a copy, or modify it after backward()");
    }
    for (size_t i = 0; i < exits_.size(); ++i) {
      AG_CHECK(!exits_[i].leaf || Values::of(Tensor(exits_[i].leaf)) == exit_values_[i], "checkpoint: ",
               Tensor(exits_[i].leaf).to_string(),
               ", which fn reads, was modified in place after the forward (an optimizer step before backward?)");
    }
    std::vector<Tensor> leaves;
    Tensor y;
    std::vector<Edge> exits;
    {
      RestoredState state(state_);
      const uint64_t first_node = next_sequence_nr();
      leaves = leaves_for(inputs_);
      y = fn_(leaves);
      AG_CHECK(y.defined() && y.shape() == grad_output.shape(), "checkpoint: the recomputation returned ",
               y.defined() ? y.to_string() : std::string("nothing"), " where the forward returned ",
               grad_output.to_string(), "; hint: fn must compute the same thing twice");
      exits = exits_of(y, leaves, first_node);
    }
    AG_CHECK(exits.size() == exits_.size() && std::equal(exits.begin(), exits.end(), exits_.begin(), same_edge),
             "checkpoint: the recomputation reaches ", exits.size(), " tensors from outside fn where the forward ",
             "reached ", exits_.size(), ", or other ones; hint: fn must not branch on values that change between ",
             "the forward and the backward");

    // Targets: the input leaves that require grad, then the exits (the node's edge order).
    std::vector<Edge> targets;
    std::vector<size_t> slot_of_target;
    for (size_t i = 0; i < leaves.size(); ++i) {
      if (leaves[i].defined() && leaves[i].requires_grad()) {
        targets.push_back({.node = nullptr, .leaf = leaves[i].impl_ptr()});
        slot_of_target.push_back(i);
      }
    }
    for (size_t i = 0; i < exits_.size(); ++i) {
      targets.push_back(exits_[i]);
      slot_of_target.push_back(inputs_.size() + i);
    }
    std::vector<Tensor> grads = edge_grads(y, grad_output, targets);
    std::vector<Tensor> result(inputs_.size() + exits_.size());
    for (size_t i = 0; i < grads.size(); ++i) result[slot_of_target[i]] = std::move(grads[i]);
    return result;
  }

  void release_saved() override {
    fn_ = nullptr;
    inputs_.clear();
    input_values_.clear();
    exit_values_.clear();
  }

 private:
  CheckpointFn fn_;
  std::vector<Tensor> inputs_;
  std::vector<Values> input_values_;
  ForwardState state_;
  std::vector<Edge> exits_;
  std::vector<Values> exit_values_;  // a leaf exit's values (a node's saved tensors guard themselves)
};

}  // namespace

Tensor checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs) {
  AG_CHECK(fn, "checkpoint: fn is empty");
  if (!GradMode::is_enabled()) return fn(inputs);
  ForwardState state = ForwardState::now();
  std::vector<Values> input_values;  // before fn runs: fn itself must not change them either
  for (const Tensor& t : inputs) input_values.push_back(Values::of(t));
  const std::vector<Tensor> leaves = leaves_for(inputs);
  const uint64_t first_node = next_sequence_nr();
  Tensor y;
  std::vector<Edge> exits;
  {
    autocast::IsolatedCastCache cast_cache;  // fn's casts are its own, and go with its graph
    y = fn(leaves);
    AG_CHECK(y.defined(), "checkpoint: fn returned an undefined tensor");
    if (!y.requires_grad()) return y;  // nothing to differentiate: there is no graph to save
    exits = exits_of(y, leaves, first_node);
  }
  auto node = std::make_shared<CheckpointNode>(fn, inputs, std::move(input_values), std::move(state), exits);
  node->next_edges.reserve(inputs.size() + exits.size());
  for (const Tensor& t : inputs) node->next_edges.push_back(edge_to(t));
  for (const Edge& e : exits) node->next_edges.push_back(e);
  // y's values without its graph: fn's saved activations are freed when y goes here.
  Tensor out = y.detach();
  out.impl()->requires_grad = true;
  out.impl()->grad_fn = std::move(node);
  return out;
}

}  // namespace ampgrad::utils
