// Optimizer updates on CUDA: ONE multi-tensor launch (framework/multi_tensor_cuda.h) updates every
// parameter's FP32 master and state and writes its rounded lower-precision copy in the same pass
// (or, without a master, rounds the updated 16-bit weights back stochastically).
#include <type_traits>

#include "framework/cuda_helpers.h"
#include "framework/multi_tensor_cuda.h"
#include "framework/stochastic_rounding.h"
#include "optim/update_kernels.h"

namespace ampgrad::optim::kernels::cuda {

namespace {

using multi_tensor::Chunk;
using namespace ::ampgrad::cuda;  // the device helpers of framework/cuda_helpers.h

// The weights of a chunk whose parameter is float32 or has an FP32 master: read and written in
// FP32, the new value also rounded (to nearest) into the 16-bit parameter R where there is one.
template <typename R>
struct MasterAccess {
  float* w;
  R* rounded;  // null (and R float) when the parameter is its own master
  __device__ float load(int64_t i) const { return w[i]; }
  __device__ void store(int64_t i, float v) const {
    w[i] = v;
    if constexpr (!std::is_same_v<R, float>) rounded[i] = dstore<R>(v);
  }
};

// 16-bit weights without a master: widened on load, rounded back stochastically on store, the
// random bits keyed by `key` and the element's index in the tensor (as on the CPU).
template <typename P>
struct StochasticAccess {
  P* w;
  int64_t first;  // the chunk's first element's index in the tensor
  uint64_t key;
  __device__ float load(int64_t i) const { return dload(w[i]); }
  __device__ void store(int64_t i, float v) const {
    const uint32_t random = stochastic::random_bits(key, static_cast<uint64_t>(first + i));
    uint16_t bits = 0;
    if constexpr (std::is_same_v<P, __nv_bfloat16>) {
      bits = stochastic::bfloat16_bits(__float_as_uint(v), random);
    } else {
      bits = stochastic::float16_bits(__float_as_uint(v), random);
    }
    reinterpret_cast<uint16_t*>(w)[i] = bits;
  }
};

// Runs loop(g, weights) with the chunk's gradient as a typed device pointer (float32 or 16-bit:
// dload widens it exactly) and its weights as one of the accesses above. Instantiated for those
// dtypes only.
template <size_t Lists, typename Loop>
__device__ __forceinline__ void with_typed_lists(const Chunk<Lists>& c, size_t weight, size_t grad, size_t rounded,
                                                 uint64_t key, Loop&& loop) {
  const auto with_grad = [&](auto weights) {
    if (c.dtype[grad] == DType::kFloat32) return loop(static_cast<const float*>(c.data[grad]), weights);
    multi_tensor::visit_dtype_in<kLowPrecisionDTypes>(c.dtype[grad], [&](auto tag) {
      loop(static_cast<const typename decltype(tag)::type*>(c.data[grad]), weights);
    });
  };
  float* const w = static_cast<float*>(c.data[weight]);
  if (c.data[rounded] != nullptr) {
    return multi_tensor::visit_dtype_in<kLowPrecisionDTypes>(c.dtype[rounded], [&](auto tag) {
      using R = typename decltype(tag)::type;
      with_grad(MasterAccess<R>{w, static_cast<R*>(c.data[rounded])});
    });
  }
  if (c.dtype[weight] == DType::kFloat32) return with_grad(MasterAccess<float>{w, nullptr});
  multi_tensor::visit_dtype_in<kLowPrecisionDTypes>(c.dtype[weight], [&](auto tag) {
    using P = typename decltype(tag)::type;
    if constexpr (sizeof(P) == 2) with_grad(StochasticAccess<P>{static_cast<P*>(c.data[weight]), c.start, key});
  });
}

struct SgdStep {
  __device__ void operator()(const Chunk<kSgdLists>& c, const SgdScalars& s) const {
    float* buf = static_cast<float*>(c.data[kSgdMomentum]);
    with_typed_lists(c, kSgdWeight, kSgdGrad, kSgdRounded, s.rounding_key, [&](const auto* g, auto weights) {
      for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) {
        float wi = weights.load(i);
        float d = dload(g[i]) + s.weight_decay * wi;
        if (buf != nullptr) {
          const float b = s.first_step ? d : s.momentum * buf[i] + s.one_minus_dampening * d;
          buf[i] = b;
          d = s.nesterov ? d + s.momentum * b : b;
        }
        wi -= s.lr * d;
        weights.store(i, wi);
      }
    });
  }
};

struct AdamStep {
  __device__ void operator()(const Chunk<kAdamLists>& c, const AdamScalars& s) const {
    float* m = static_cast<float*>(c.data[kAdamExpAvg]);
    float* v = static_cast<float*>(c.data[kAdamExpAvgSq]);
    with_typed_lists(c, kAdamWeight, kAdamGrad, kAdamRounded, s.rounding_key, [&](const auto* g, auto weights) {
      for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) {
        float wi = weights.load(i);
        const float gi = dload(g[i]) + s.l2 * wi;
        wi *= s.decoupled;
        const float mi = s.beta1 * m[i] + s.one_minus_beta1 * gi;
        const float vi = s.beta2 * v[i] + s.one_minus_beta2 * gi * gi;
        wi -= s.step_size * mi / (sqrtf(vi) / s.bc2_sqrt + s.eps);
        m[i] = mi;
        v[i] = vi;
        weights.store(i, wi);
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
