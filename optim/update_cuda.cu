// Optimizer updates on CUDA: ONE multi-tensor launch (framework/multi_tensor_cuda.h) updates every
// parameter's FP32 master and state and writes its rounded lower-precision copy in the same pass.
#include <type_traits>

#include "framework/cuda_helpers.h"
#include "framework/multi_tensor_cuda.h"
#include "optim/update_kernels.h"

namespace ampgrad::optim::kernels::cuda {

namespace {

using multi_tensor::Chunk;
using namespace ::ampgrad::cuda;  // the device helpers of framework/cuda_helpers.h

// Runs loop(g, rounded) with the chunk's gradient as a typed device pointer (float32 or 16-bit:
// dload widens it exactly) and its rounded copy as one (a float* null pointer when the parameter
// has none: a float32 parameter is its own master). Instantiated for those dtypes only.
template <size_t Lists, typename Loop>
__device__ __forceinline__ void with_typed_lists(const Chunk<Lists>& c, size_t grad, size_t rounded, Loop&& loop) {
  const auto with_grad = [&](auto* copy) {
    if (c.dtype[grad] == DType::kFloat32) return loop(static_cast<const float*>(c.data[grad]), copy);
    multi_tensor::visit_dtype_in<kLowPrecisionDTypes>(c.dtype[grad], [&](auto tag) {
      loop(static_cast<const typename decltype(tag)::type*>(c.data[grad]), copy);
    });
  };
  if (c.data[rounded] == nullptr) return with_grad(static_cast<float*>(nullptr));
  multi_tensor::visit_dtype_in<kLowPrecisionDTypes>(c.dtype[rounded], [&](auto tag) {
    with_grad(static_cast<typename decltype(tag)::type*>(c.data[rounded]));
  });
}

struct SgdStep {
  __device__ void operator()(const Chunk<kSgdLists>& c, const SgdScalars& s) const {
    float* w = static_cast<float*>(c.data[kSgdWeight]);
    float* buf = static_cast<float*>(c.data[kSgdMomentum]);
    with_typed_lists(c, kSgdGrad, kSgdRounded, [&](const auto* g, auto* rounded) {
      using P = std::remove_pointer_t<decltype(rounded)>;
      for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) {
        float wi = w[i];
        float d = dload(g[i]) + s.weight_decay * wi;
        if (buf != nullptr) {
          const float b = s.first_step ? d : s.momentum * buf[i] + s.one_minus_dampening * d;
          buf[i] = b;
          d = s.nesterov ? d + s.momentum * b : b;
        }
        wi -= s.lr * d;
        w[i] = wi;
        if constexpr (!std::is_same_v<P, float>) rounded[i] = dstore<P>(wi);
      }
    });
  }
};

struct AdamStep {
  __device__ void operator()(const Chunk<kAdamLists>& c, const AdamScalars& s) const {
    float* w = static_cast<float*>(c.data[kAdamWeight]);
    float* m = static_cast<float*>(c.data[kAdamExpAvg]);
    float* v = static_cast<float*>(c.data[kAdamExpAvgSq]);
    with_typed_lists(c, kAdamGrad, kAdamRounded, [&](const auto* g, auto* rounded) {
      using P = std::remove_pointer_t<decltype(rounded)>;
      for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) {
        float wi = w[i];
        const float gi = dload(g[i]) + s.l2 * wi;
        wi *= s.decoupled;
        const float mi = s.beta1 * m[i] + s.one_minus_beta1 * gi;
        const float vi = s.beta2 * v[i] + s.one_minus_beta2 * gi * gi;
        wi -= s.step_size * mi / (sqrtf(vi) / s.bc2_sqrt + s.eps);
        m[i] = mi;
        v[i] = vi;
        w[i] = wi;
        if constexpr (!std::is_same_v<P, float>) rounded[i] = dstore<P>(wi);
      }
    });
  }
};

}  // namespace

void sgd_update(const std::vector<Chunk<kSgdLists>>& chunks, const std::vector<SgdScalars>& scalars) {
  multi_tensor::apply_cuda(chunks, scalars, SgdStep{}, "sgd_update (multi-tensor)");
}

void adam_update(const std::vector<Chunk<kAdamLists>>& chunks, const std::vector<AdamScalars>& scalars) {
  multi_tensor::apply_cuda(chunks, scalars, AdamStep{}, "adam_update (multi-tensor)");
}

}  // namespace ampgrad::optim::kernels::cuda
