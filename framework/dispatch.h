// The op dispatcher. Every op runs through dispatch<Op>() in this order:
//   autocast casts (recorded, so grads flow back to the source dtype) -> checks on the post-cast
//   inputs -> forward (which picks the kernel by device and dtype) -> a tape node with the
//   tensors the forward saved.
//
// An op is one struct, declared in one place:
//   struct Relu {
//     static constexpr OpInfo kInfo{"relu", CastPolicy::kNone};
//     void check(const Tensor& x) const;                        // throw on bad input
//     Tensor forward(SavedTensors& saved, const Tensor& x);     // save what backward needs
//     std::vector<Tensor> backward(const SavedTensors& saved, const Tensor& dy) const;  // one per input
//   };                                              // (undefined where !saved.needs_grad(i))
// Non-tensor arguments (a scalar, a target dtype) are members of the struct.
#pragma once

#include <array>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "framework/autocast.h"
#include "framework/autograd.h"
#include "framework/error.h"
#include "framework/tensor_impl.h"

namespace ampgrad {

namespace detail {

template <typename Op>
class OpNode final : public Node {
 public:
  OpNode(Op op, SavedTensors saved) : op_(std::move(op)), saved_(std::move(saved)) {}
  std::string_view name() const override { return Op::kInfo.name; }
  std::vector<Tensor> backward(const Tensor& grad_output) override { return op_.backward(saved_, grad_output); }
  void release_saved() override { saved_.release(); }

 private:
  Op op_;
  SavedTensors saved_;
};

/// Throws a clear error when an input that must be floating is an integer tensor.
void check_integer_inputs(const OpInfo& info, std::span<const Tensor> inputs);

/// The dispatch order for inputs already gathered (a std::array or, for ops over a list of
/// tensors, a std::vector); check(op) and forward(op, saved) call the op's own functions.
template <typename Op, typename Inputs, typename Check, typename Forward>
Tensor run_op(Op op, Inputs& inputs, Check&& check, Forward&& forward) {
  autocast::cast_inputs(Op::kInfo, inputs);
  if constexpr (Op::kInfo.integer_inputs != kAnyInputMayBeInteger) detail::check_integer_inputs(Op::kInfo, inputs);
  check(op);

  SavedTensors saved(Op::kInfo.name);
  bool record = false;
  AG_CHECK(inputs.size() <= SavedTensors::kMaxInputs, Op::kInfo.name, ": ", inputs.size(),
           " inputs; an op takes at most ", SavedTensors::kMaxInputs);
  if (GradMode::is_enabled()) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].defined() && inputs[i].requires_grad()) {
        saved.set_needs_grad(i);
        record = true;
      }
    }
  }
  Tensor out;
  try {
    NoGradGuard no_grad;  // ops used inside a forward are implementation detail, not tape entries
    out = forward(op, saved);
  } catch (const std::bad_alloc&) {
    // A kernel's host scratch (a packing buffer, a row of partial sums) is sized by the inputs:
    // running out is the user's problem to see, as an Error naming the op, not a bad_alloc.
    std::string shapes;
    for (const Tensor& in : inputs) shapes += (shapes.empty() ? "" : ", ") + in.to_string();
    AG_FAIL(Op::kInfo.name, ": out of host memory for the op's temporary buffers (inputs: ", shapes, ")");
  }
  if (record && is_floating(out.dtype())) {  // an integer result (argmax) has no gradient
    saved.check_not_saved(out);
    auto node = std::make_shared<OpNode<Op>>(std::move(op), std::move(saved));
    node->next_edges.reserve(inputs.size());
    for (const Tensor& in : inputs) node->next_edges.push_back(edge_to(in));
    out.impl()->requires_grad = true;
    out.impl()->grad_fn = std::move(node);
  }
  return out;
}

}  // namespace detail

/// Runs an op over a fixed number of tensor inputs (see the top of this file).
template <typename Op, typename... Inputs>
Tensor dispatch(Op op, const Inputs&... raw_inputs) {
  std::array<Tensor, sizeof...(Inputs)> inputs{raw_inputs...};
  return detail::run_op(
      std::move(op), inputs, [&](const Op& o) { std::apply([&](const auto&... in) { o.check(in...); }, inputs); },
      [&](Op& o, SavedTensors& saved) {
        return std::apply([&](const auto&... in) { return o.forward(saved, in...); }, inputs);
      });
}

/// Runs an op over a list of tensors (cat): its check and forward take std::span<const Tensor>.
template <typename Op>
Tensor dispatch_list(Op op, std::vector<Tensor> inputs) {
  return detail::run_op(
      std::move(op), inputs, [&](const Op& o) { o.check(std::span<const Tensor>(inputs)); },
      [&](Op& o, SavedTensors& saved) { return o.forward(saved, std::span<const Tensor>(inputs)); });
}

}  // namespace ampgrad
