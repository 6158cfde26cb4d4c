// embedding: rows of a weight [V, C] gathered by int64 ids [...] -> [..., C]; the gradient is a
// scatter-add into the rows that were used. Autocast: none (runs in the weight's dtype).
#include "framework/dispatch.h"
#include "ops/checks.h"
#include "ops/embedding/embedding_kernels.h"
#include "ops/ops.h"

namespace ampgrad::ops {

namespace {

struct Embedding {
  static constexpr OpInfo kInfo{"embedding", CastPolicy::kNone, /*integer_inputs=*/0b01};  // the ids

  void check(const Tensor& ids, const Tensor& weight) const {
    AG_CHECK(ids.defined() && weight.defined(), kInfo.name, ": ids and weight must be defined");
    const auto both = [&] { return describe({{"ids", &ids}, {"weight", &weight}}); };
    AG_CHECK(ids.device() == weight.device(), kInfo.name, ": ids and weight are on different devices (", both(), ")");
    AG_CHECK(ids.dtype() == DType::kInt64, kInfo.name, ": ids must be int64, got ", both(),
             "; hint: Tensor::from_vector(std::vector<int64_t>{...}, shape)");
    AG_CHECK(weight.dim() == 2, kInfo.name, ": weight must be [V, C], got ", both());
  }

  Tensor forward(SavedTensors& saved, const Tensor& ids, const Tensor& weight) const {
    saved.save(ids);
    Shape shape = ids.shape();
    shape.push_back(weight.size(1));
    Tensor out = Tensor::empty(shape, weight.dtype(), weight.device());
    kernels::embedding(ids, weight, out);
    return out;
  }

  std::vector<Tensor> backward(const SavedTensors& saved, const Tensor& dy) const {
    Tensor dw;
    if (saved.needs_grad(1)) {
      dw = Tensor::empty({weight_rows, dy.size(-1)}, dy.dtype(), dy.device());
      kernels::embedding_backward(saved[0], dy, dw);
    }
    return {Tensor(), dw};
  }

  int64_t weight_rows = 0;
};

}  // namespace

Tensor embedding(const Tensor& ids, const Tensor& weight) {
  AG_CHECK(weight.defined(), "embedding: weight is undefined");
  return dispatch(Embedding{.weight_rows = weight.dim() == 2 ? weight.size(0) : 0}, ids, weight);
}

}  // namespace ampgrad::ops
