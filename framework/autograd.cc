// The backward engine: collect the nodes reachable from the root, replay them in reverse tape
// order, sum gradients per node and accumulate (+=) into leaves.
#include "framework/autograd.h"

#include <algorithm>
#include <unordered_map>

#include "framework/copy.h"
#include "framework/error.h"
#include "framework/tensor_impl.h"

namespace ampgrad {

namespace {
thread_local bool grad_mode_enabled = true;
thread_local uint64_t tape_position = 0;  // sequence number of the next recorded node
}  // namespace

bool GradMode::is_enabled() { return grad_mode_enabled; }
void GradMode::set_enabled(bool enabled) { grad_mode_enabled = enabled; }

void SavedTensors::save(const Tensor& tensor) {
  tensors_.push_back(tensor.defined() ? tensor.detach() : Tensor());
  versions_.push_back(tensor.defined() ? tensor.version() : 0);
}

const Tensor& SavedTensors::operator[](size_t index) const {
  AG_CHECK(!released_, "backward of ", op_name_, " was called after its saved tensors were freed: this ",
           "graph was already consumed by a backward(); hint: pass RetainGraph::kYes to the first backward ",
           "to backpropagate through the same graph again");
  const Tensor& tensor = tensors_.at(index);
  AG_CHECK(!tensor.defined() || tensor.version() == versions_[index], "a tensor ", tensor.to_string(),
           " saved for the backward of ", op_name_, " was modified in place (version ", tensor.version(),
           ", saved at version ", versions_[index], "); hint: run optimizer.step() only after backward()");
  return tensor;
}

void SavedTensors::release() {
  tensors_.clear();
  released_ = true;
}

Node::Node() : sequence_nr_(tape_position++) {}

Edge edge_to(const Tensor& input) {
  if (!input.defined() || !input.requires_grad()) return {};
  if (input.grad_fn()) return {.node = input.grad_fn(), .leaf = nullptr};
  // A leaf: the graph keeps it alive so the gradient has somewhere to go.
  return {.node = nullptr, .leaf = input.impl_ptr()};
}

namespace {

void accumulate_into_leaf(TensorImpl& leaf, const Tensor& grad) {
  Tensor g = grad;
  if (g.dtype() != leaf.dtype) g = g.to(leaf.dtype);  // a leaf's gradient has the leaf's dtype
  if (!leaf.grad.defined()) {
    // Own a fresh buffer: the incoming gradient may be shared with other consumers.
    Tensor fresh = Tensor::empty(leaf.shape, leaf.dtype, leaf.storage->device);
    copy_(fresh, g);
    leaf.grad = fresh;
  } else {
    accumulate_(leaf.grad, g);
  }
}

// Every node reachable from `root`, sorted so that each runs after all nodes that feed it grads.
std::vector<Node*> nodes_in_replay_order(Node* root) {
  std::vector<Node*> order;
  std::vector<Node*> stack{root};
  std::unordered_map<Node*, bool> seen{{root, true}};
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    order.push_back(node);
    for (const Edge& edge : node->next_edges) {
      if (edge.node && seen.emplace(edge.node.get(), true).second) stack.push_back(edge.node.get());
    }
  }
  // A node's inputs were recorded before it, so descending sequence numbers are a valid
  // topological order: this is replaying the tape backwards.
  std::sort(order.begin(), order.end(), [](Node* a, Node* b) { return a->sequence_nr() > b->sequence_nr(); });
  return order;
}

}  // namespace

void run_backward(const Tensor& root, const Tensor& grad, RetainGraph retain) {
  AG_CHECK(root.defined(), "backward() on an undefined tensor");
  AG_CHECK(root.requires_grad(), "backward() on ", root.to_string(), " which does not require grad and has no ",
           "grad_fn; hint: call set_requires_grad(true) on the leaves you want gradients for, and make sure ",
           "the forward did not run under NoGradGuard");
  Tensor seed = grad;
  if (!seed.defined()) {
    AG_CHECK(root.numel() == 1, "backward() without a gradient needs a one-element output, got ", root.to_string(),
             "; hint: pass backward(grad) with the output's shape, or reduce with ops::sum/ops::mean first");
    seed = ones(root.shape(), root.dtype(), root.device());
  }
  AG_CHECK(seed.shape() == root.shape() && seed.device() == root.device(), "backward(grad): grad ",
           seed.to_string(), " does not match the output ", root.to_string());
  if (seed.dtype() != root.dtype()) seed = seed.detach().to(root.dtype());

  NoGradGuard no_grad;  // backward formulas are not themselves recorded
  if (!root.grad_fn()) {
    accumulate_into_leaf(*root.impl(), seed);
    return;
  }
  std::unordered_map<Node*, Tensor> pending{{root.grad_fn().get(), seed}};
  for (Node* node : nodes_in_replay_order(root.grad_fn().get())) {
    auto it = pending.find(node);
    if (it == pending.end()) continue;  // nothing flowed into it (its consumers had no grad for it)
    const Tensor grad_output = std::move(it->second);
    pending.erase(it);
    std::vector<Tensor> grad_inputs = node->backward(grad_output);
    AG_CHECK(grad_inputs.size() == node->next_edges.size(), "internal: ", node->name(), " returned ",
             grad_inputs.size(), " gradients for ", node->next_edges.size(), " inputs");
    for (size_t i = 0; i < grad_inputs.size(); ++i) {
      const Edge& edge = node->next_edges[i];
      Tensor& g = grad_inputs[i];
      if (!g.defined()) continue;
      if (edge.leaf) {
        accumulate_into_leaf(*edge.leaf, g);
      } else if (edge.node) {
        auto [slot, inserted] = pending.try_emplace(edge.node.get(), g);
        if (!inserted) {
          // Two consumers: sum into a fresh buffer (either gradient may alias another tensor).
          Tensor sum = Tensor::empty(slot->second.shape(), slot->second.dtype(), slot->second.device());
          copy_(sum, slot->second);
          accumulate_(sum, g);
          slot->second = sum;
        }
      }
    }
    if (retain == RetainGraph::kNo) node->release_saved();
  }
}

}  // namespace ampgrad
