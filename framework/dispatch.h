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
#include <tuple>
#include <utility>
#include <vector>

#include "framework/autocast.h"
#include "framework/autograd.h"
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

}  // namespace detail

template <typename Op, typename... Inputs>
Tensor dispatch(Op op, const Inputs&... raw_inputs) {
  std::array<Tensor, sizeof...(Inputs)> inputs{raw_inputs...};
  autocast::cast_inputs(Op::kInfo, inputs);
  std::apply([&](const auto&... in) { op.check(in...); }, inputs);

  SavedTensors saved(Op::kInfo.name);
  bool record = false;
  static_assert(sizeof...(Inputs) <= SavedTensors::kMaxInputs);
  if (GradMode::is_enabled()) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].defined() && inputs[i].requires_grad()) {
        saved.set_needs_grad(i);
        record = true;
      }
    }
  }
  Tensor out;
  {
    NoGradGuard no_grad;  // ops used inside a forward are implementation detail, not tape entries
    out = std::apply([&](const auto&... in) { return op.forward(saved, in...); }, inputs);
  }
  if (record) {
    saved.check_not_saved(out);
    auto node = std::make_shared<detail::OpNode<Op>>(std::move(op), std::move(saved));
    node->next_edges.reserve(inputs.size());
    for (const Tensor& in : inputs) node->next_edges.push_back(edge_to(in));
    out.impl()->requires_grad = true;
    out.impl()->grad_fn = std::move(node);
  }
  return out;
}

}  // namespace ampgrad
