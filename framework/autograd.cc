// The backward engine: collect the nodes reachable from the root, replay them in reverse tape
// order, sum gradients per node and accumulate (+=) into leaves.
#include "framework/autograd.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <new>
#include <unordered_map>
#include <unordered_set>

#include "framework/autocast.h"
#include "framework/copy.h"
#include "framework/error.h"
#include "framework/tensor_impl.h"

namespace ampgrad {

namespace {
thread_local bool grad_mode_enabled = true;
// Sequence number of the next recorded node. One counter for all threads, so that a graph built
// partly on another thread still replays in recording order.
std::atomic<uint64_t> tape_position{0};
}  // namespace

bool GradMode::is_enabled() { return grad_mode_enabled; }
void GradMode::set_enabled(bool enabled) { grad_mode_enabled = enabled; }

void SavedTensors::save(const Tensor& tensor) {
  AG_CHECK(count_ < kMaxSaved, "internal: ", op_name_, " saves more than ", kMaxSaved, " tensors");
  Entry& entry = entries_[count_++];
  entry.tensor = tensor;
  if (tensor.defined()) {
    entry.storage = tensor.impl()->storage;
    entry.version = tensor.version();
  }
}

const Tensor& SavedTensors::operator[](size_t index) const {
  AG_CHECK(!released_, "backward of ", op_name_, " was called after its saved tensors were freed: this ",
           "graph was already consumed by a backward(); hint: pass RetainGraph::kYes to the first backward ",
           "to backpropagate through the same graph again");
  AG_CHECK(index < count_, "internal: ", op_name_, " reads saved tensor ", index, " of ", count_);
  const Entry& entry = entries_[index];
  const Tensor& tensor = entry.tensor;
  if (!tensor.defined()) return tensor;
  AG_CHECK(tensor.impl()->storage == entry.storage, "a tensor ", tensor.to_string(), " saved for the backward of ",
           op_name_, " had its data replaced (set_data, Module::to or a load) before backward; hint: change ",
           "parameters only between steps, after backward()");
  AG_CHECK(tensor.version() == entry.version, "a tensor ", tensor.to_string(), " saved for the backward of ",
           op_name_, " was modified in place (version ", tensor.version(), ", saved at version ", entry.version,
           "); hint: run optimizer.step() only after backward()");
  return tensor;
}

void SavedTensors::check_not_saved(const Tensor& output) const {
  for (size_t i = 0; i < count_; ++i) {
    AG_CHECK(!entries_[i].tensor.is_same(output), "internal: ", op_name_, " saved its own output for backward, ",
             "which would keep its graph alive forever; save inputs only");
  }
}

void SavedTensors::release() {
  for (size_t i = 0; i < count_; ++i) entries_[i] = Entry{};
  released_ = true;
}

Node::Node() : sequence_nr_(tape_position.fetch_add(1, std::memory_order_relaxed)) {}

// By the time this runs, the subclass's saved tensors are gone; their grad_fns went through
// release_node (from ~TensorImpl) as well.
Node::~Node() {
  for (Edge& edge : next_edges) release_node(edge.node);
}

namespace {
// The release running on this thread, if any: nodes whose last owner let go while it runs wait
// here and are freed by its loop, one at a time. A raw pointer to the outermost call's local
// queue: trivially destructible, so tensors freed during thread exit can still read it.
constinit thread_local std::vector<std::shared_ptr<Node>>* release_queue = nullptr;
}  // namespace

void detail::release_last_owner(std::shared_ptr<Node>& node) noexcept {
  if (release_queue != nullptr) {
    try {
      if (release_queue->capacity() == 0) release_queue->reserve(32);  // one allocation for a typical graph
      release_queue->push_back(std::move(node));  // strong guarantee: on failure node is intact
    } catch (...) {
      node.reset();  // out of memory: free it here, recursing one level
    }
    return;
  }
  std::vector<std::shared_ptr<Node>> queue;
  release_queue = &queue;
  node.reset();  // its destructor queues whatever it alone held
  while (!queue.empty()) {
    std::shared_ptr<Node> next = std::move(queue.back());
    queue.pop_back();
    next.reset();
  }
  release_queue = nullptr;
}

namespace detail {

void check_integer_inputs(const OpInfo& info, std::span<const Tensor> inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined() || is_compute(t.dtype()) || ((info.integer_inputs >> i) & 1u) != 0) continue;
    AG_CHECK(!is_float8(t.dtype()), info.name, ": input ", i, " is ", t.to_string(), ", an 8-bit float, which ops ",
             "do not compute in (as in PyTorch, it is a storage format: cast, copied and viewed); hint: cast it ",
             "with .to(DType::kFloat32) or .to(DType::kBFloat16) first");
    AG_FAIL(info.name, ": input ", i, " is ", t.to_string(), " but ", info.name, " computes on floating-point ",
            "tensors; hint: cast it with .to(DType::kFloat32)");
  }
}

}  // namespace detail

Edge edge_to(const Tensor& input) {
  if (!input.defined() || !input.requires_grad()) return {};
  if (input.grad_fn()) return {.node = input.grad_fn(), .leaf = nullptr};
  // A leaf: the graph keeps it alive so the gradient has somewhere to go.
  return {.node = nullptr, .leaf = input.impl_ptr()};
}

namespace {

// Graphs that share a leaf may run backward on several threads at once (PyTorch allows it), so
// accumulation into a leaf holds that leaf's lock: a stripe of a fixed table picked by the leaf's
// address, so TensorImpl carries no mutex. Uncontended it is one atomic pair per leaf per backward.
std::mutex& leaf_lock(const TensorImpl& leaf) {
  static std::array<std::mutex, 64> locks;
  const auto address = reinterpret_cast<uintptr_t>(&leaf);
  return locks[(address >> 4) * 0x9e3779b97f4a7c15u >> 58];  // Fibonacci hashing onto 64 stripes
}

// A first gradient that nothing else can see (no other handle, no shared storage or alias, no history)
// becomes the leaf's grad as it is, as in PyTorch; anything else is copied, since it may be shared
// with other consumers. Taking it saves a full copy of every weight gradient per step.
void accumulate_into_leaf(TensorImpl& leaf, Tensor&& grad, uint64_t pass) {
  Tensor g = std::move(grad);
  if (g.dtype() != leaf.dtype) g = g.to(leaf.dtype);  // a leaf's gradient has the leaf's dtype
  std::lock_guard lock(leaf_lock(leaf));  // the pass stamp is the leaf's state too
  leaf.grad_pass = pass;
  if (leaf.grad.defined()) return accumulate_(leaf.grad, g);
  const TensorImpl& gi = *g.impl();
  const bool unshared = g.impl_ptr().use_count() == 1 && gi.storage.use_count() == 1 && !gi.storage->base && !gi.grad_fn &&
                        !gi.requires_grad && !gi.master.defined() && !gi.grad.defined() && gi.shape == leaf.shape &&
                        gi.storage->device == leaf.storage->device;
  if (unshared) {
    leaf.grad = std::move(g);
    return;
  }
  Tensor fresh = Tensor::empty(leaf.shape, leaf.dtype, leaf.storage->device);
  copy_(fresh, g);
  leaf.grad = fresh;
}

void run_post_accumulate_hooks(const std::shared_ptr<TensorImpl>& leaf) {
  const auto hooks = leaf->post_accumulate_grad_hooks;  // a hook may remove hooks: iterate a copy
  if (!hooks) return;
  const Tensor tensor(leaf);
  for (const auto& [id, hook] : std::vector(hooks->hooks)) hook(tensor);
}

// Leaves with hooks that this pass reaches, each with the number of edges into it still to be
// replayed: the hooks run when the last one is done, so they see the leaf's whole gradient.
class LeafHookCounts {
 public:
  void expect(const Edge& edge) {
    if (edge.leaf && edge.leaf->post_accumulate_grad_hooks) entries_.push_back({edge.leaf.get(), 1, false});
  }
  void seal() {  // merge the duplicates expect() pushed, then look up by binary search
    std::sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) { return a.leaf < b.leaf; });
    size_t out = 0;
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (out > 0 && entries_[out - 1].leaf == entries_[i].leaf) {
        ++entries_[out - 1].pending;
      } else {
        entries_[out++] = entries_[i];
      }
    }
    entries_.resize(out);
  }
  void accumulated(const Edge& edge) {
    if (Entry* e = find(edge)) e->got_grad = true;
  }
  // After a node's edges were replayed (or skipped): runs the hooks of leaves now complete.
  void done(const Node& node) {
    if (entries_.empty()) return;
    for (const Edge& edge : node.next_edges) {
      Entry* e = find(edge);
      if (e && --e->pending == 0 && e->got_grad) run_post_accumulate_hooks(edge.leaf);
    }
  }

 private:
  struct Entry {
    TensorImpl* leaf;
    int64_t pending;
    bool got_grad;
  };
  Entry* find(const Edge& edge) {
    if (!edge.leaf || !edge.leaf->post_accumulate_grad_hooks) return nullptr;
    auto it = std::lower_bound(entries_.begin(), entries_.end(), edge.leaf.get(),
                               [](const Entry& a, const TensorImpl* leaf) { return a.leaf < leaf; });
    return it != entries_.end() && it->leaf == edge.leaf.get() ? &*it : nullptr;
  }
  std::vector<Entry> entries_;  // allocates only when some leaf has hooks
};

}  // namespace

// The gradients a pass hands back instead of accumulating them (grad()): one slot per target leaf.
struct detail::Captures {
  std::unordered_map<const TensorImpl*, size_t> leaf_index;  // target leaf -> its slot
  std::unordered_map<const Node*, size_t> node_index;        // target node -> its slot
  std::vector<Tensor> grads;
  Tensor* slot(const TensorImpl* leaf) {
    const auto it = leaf_index.find(leaf);
    return it == leaf_index.end() ? nullptr : &grads[it->second];
  }
  Tensor* slot(const Node* node) {
    const auto it = node_index.find(node);
    return it == node_index.end() ? nullptr : &grads[it->second];
  }
};

namespace {

// Sums g into a capture slot: the first as it is, later ones into a fresh buffer. A leaf's
// gradient takes the leaf's dtype, as accumulation would give it.
void capture_into(Tensor& slot, const TensorImpl* leaf, Tensor&& g) {
  if (leaf != nullptr && g.dtype() != leaf->dtype) g = g.to(leaf->dtype);
  if (!slot.defined()) {
    slot = std::move(g);
    return;
  }
  Tensor sum = Tensor::empty(slot.shape(), slot.dtype(), slot.device());
  copy_(sum, slot);
  accumulate_(sum, g);
  slot = std::move(sum);
}

// A pass's scratch: the outermost pass on a thread reuses one pair of vectors (no allocations in a
// steady loop); a pass started inside a node's backward (activation checkpointing's recompute) has
// its own.
thread_local int pass_depth = 0;
}  // namespace

void run_backward(const Tensor& root, const Tensor& grad, RetainGraph retain) {
  detail::backward_pass(root, grad, retain, nullptr);
}

std::vector<Tensor> edge_grads(const Tensor& root, const Tensor& grad_output, const std::vector<Edge>& targets) {
  detail::Captures captures;
  for (const Edge& target : targets) {
    AG_CHECK((target.leaf != nullptr) != (target.node != nullptr), "grad: a target is a leaf or a node, not both");
    const size_t next = captures.grads.size();
    if (target.leaf ? captures.leaf_index.try_emplace(target.leaf.get(), next).second
                    : captures.node_index.try_emplace(target.node.get(), next).second) {
      captures.grads.emplace_back();
    }
  }
  detail::backward_pass(root, grad_output, RetainGraph::kNo, &captures);
  std::vector<Tensor> grads;  // one per target, a repeated target's too
  grads.reserve(targets.size());
  for (const Edge& target : targets) {
    grads.push_back(target.leaf ? *captures.slot(target.leaf.get()) : *captures.slot(target.node.get()));
  }
  return grads;
}

std::vector<Tensor> grad(const Tensor& root, const Tensor& grad_output, const std::vector<Tensor>& leaves) {
  std::vector<Edge> targets;
  for (const Tensor& leaf : leaves) {
    AG_CHECK(leaf.defined() && leaf.requires_grad() && !leaf.grad_fn(), "grad: every target must be a leaf that ",
             "requires grad, got ", leaf.defined() ? leaf.to_string() : std::string("an undefined tensor"));
    targets.push_back({.node = nullptr, .leaf = leaf.impl_ptr()});
  }
  return edge_grads(root, grad_output, targets);
}

uint64_t next_sequence_nr() { return tape_position.load(std::memory_order_relaxed); }

void detail::backward_pass(const Tensor& root, const Tensor& grad, RetainGraph retain, Captures* captures) {
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
  static std::atomic<uint64_t> passes{0};
  const uint64_t pass = ++passes;
  if (captures != nullptr) {  // a root that is itself a target: its gradient is the seed
    Tensor* slot = root.grad_fn() ? captures->slot(root.grad_fn().get()) : captures->slot(root.impl());
    if (slot != nullptr) return capture_into(*slot, root.grad_fn() ? nullptr : root.impl(), std::move(seed));
    if (!root.grad_fn()) return;
  }
  if (!root.grad_fn()) {
    accumulate_into_leaf(*root.impl(), std::move(seed), pass);
    run_post_accumulate_hooks(root.impl_ptr());
    return;
  }
  // Every node reachable from the root, sorted so that each runs after all nodes that feed it
  // grads. A node's inputs were recorded before it, so descending sequence numbers are a valid
  // topological order: this is replaying the tape backwards.
  Node* root_node = root.grad_fn().get();
  thread_local std::vector<Node*> reused_order, reused_stack;
  std::vector<Node*> own_order, own_stack;
  std::vector<Node*>& order = pass_depth == 0 ? reused_order : own_order;
  std::vector<Node*>& stack = pass_depth == 0 ? reused_stack : own_stack;
  ++pass_depth;
  struct Depth {
    ~Depth() { --pass_depth; }
  } depth;
  order.clear();
  stack.assign(1, root_node);
  root_node->visited_pass_ = pass;
  LeafHookCounts leaf_hooks;
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    order.push_back(node);
    for (const Edge& edge : node->next_edges) {
      if (captures == nullptr) leaf_hooks.expect(edge);  // grad() accumulates nothing: no hooks run
      if (captures != nullptr && edge.node && captures->slot(edge.node.get())) continue;  // a target: not run
      if (edge.node && edge.node->visited_pass_ != pass) {
        edge.node->visited_pass_ = pass;
        stack.push_back(edge.node.get());
      }
    }
  }
  std::sort(order.begin(), order.end(), [](Node* a, Node* b) { return a->sequence_nr() > b->sequence_nr(); });
  leaf_hooks.seal();

  // Whether backward finishes or throws, no gradient is left on a node for a later backward.
  struct ClearPending {
    std::vector<Node*>& nodes;
    ~ClearPending() {
      for (Node* node : nodes) node->pending_grad_ = Tensor();
    }
  } clear_pending{order};
  root_node->pending_grad_ = std::move(seed);
  for (Node* node : order) {
    if (!node->pending_grad_.defined()) {  // nothing flowed into it (its consumers had no grad for it)
      leaf_hooks.done(*node);
      continue;
    }
    const Tensor grad_output = std::move(node->pending_grad_);
    node->pending_grad_ = Tensor();
    std::vector<Tensor> grad_inputs;
    try {
      grad_inputs = node->backward(grad_output);
    } catch (const std::bad_alloc&) {  // as in dispatch(): a kernel's host scratch, sized by the tensors
      AG_FAIL("backward of ", node->name(), ": out of host memory for the op's temporary buffers (gradient ",
              grad_output.to_string(), ")");
    }
    AG_CHECK(grad_inputs.size() == node->next_edges.size(), "internal: ", node->name(), " returned ",
             grad_inputs.size(), " gradients for ", node->next_edges.size(), " inputs");
    for (size_t i = 0; i < grad_inputs.size(); ++i) {
      const Edge& edge = node->next_edges[i];
      Tensor& g = grad_inputs[i];
      if (!g.defined()) continue;
      if (edge.leaf && captures != nullptr) {
        if (Tensor* slot = captures->slot(edge.leaf.get())) capture_into(*slot, edge.leaf.get(), std::move(g));
      } else if (edge.node && captures != nullptr && captures->slot(edge.node.get())) {
        capture_into(*captures->slot(edge.node.get()), nullptr, std::move(g));
      } else if (edge.leaf) {
        accumulate_into_leaf(*edge.leaf, std::move(g), pass);
        leaf_hooks.accumulated(edge);
      } else if (edge.node) {
        Tensor& slot = edge.node->pending_grad_;
        if (!slot.defined()) {
          slot = std::move(g);
        } else {
          // Two consumers: sum into a fresh buffer (either gradient may alias another tensor).
          Tensor sum = Tensor::empty(slot.shape(), slot.dtype(), slot.device());
          copy_(sum, slot);
          accumulate_(sum, g);
          slot = std::move(sum);
        }
      }
    }
    if (retain == RetainGraph::kNo) node->release_saved();
    leaf_hooks.done(*node);
  }
}

void walk_graph(const Node& root, const std::function<bool(const Node&, size_t)>& visit) {
  std::unordered_set<const Node*> seen{&root};
  std::vector<const Node*> stack{&root};
  while (!stack.empty()) {
    const Node* node = stack.back();
    stack.pop_back();
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Node* next = node->next_edges[i].node.get();
      if (visit(*node, i) && next != nullptr && seen.insert(next).second) stack.push_back(next);
    }
  }
}

std::vector<const TensorImpl*> leaves_in_backward_order(const Tensor& root) {
  if (!root.defined() || !root.requires_grad()) return {};
  if (!root.grad_fn()) return {root.impl()};
  // A leaf is first written by its consumer with the largest sequence number, through that
  // consumer's first edge to it (a node writes its inputs' gradients in edge order).
  struct FirstWrite {
    uint64_t sequence_nr;
    size_t edge;
  };
  std::unordered_map<const TensorImpl*, FirstWrite> first_writes;
  walk_graph(*root.grad_fn(), [&](const Node& node, size_t i) {
    const Edge& edge = node.next_edges[i];
    if (edge.leaf) {
      const FirstWrite here{node.sequence_nr(), i};
      auto [it, fresh] = first_writes.try_emplace(edge.leaf.get(), here);
      if (!fresh && here.sequence_nr > it->second.sequence_nr) it->second = here;
    }
    return true;
  });
  std::vector<std::pair<FirstWrite, const TensorImpl*>> writes;
  writes.reserve(first_writes.size());
  for (const auto& [leaf, write] : first_writes) writes.emplace_back(write, leaf);
  std::sort(writes.begin(), writes.end(), [](const auto& a, const auto& b) {
    return a.first.sequence_nr != b.first.sequence_nr ? a.first.sequence_nr > b.first.sequence_nr
                                                      : a.first.edge < b.first.edge;
  });
  std::vector<const TensorImpl*> leaves;
  leaves.reserve(writes.size());
  for (const auto& write : writes) leaves.push_back(write.second);
  return leaves;
}

}  // namespace ampgrad
