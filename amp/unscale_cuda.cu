// The unscale kernel family on CUDA: one multi-tensor launch (framework/multi_tensor_cuda.h) for
// any model size, the flag (and the counts, when measuring) read back in one host sync.
#include "amp/unscale_kernels.h"

#include <cstddef>
#include <cstring>
#include <vector>

#include "framework/cuda_helpers.h"
#include "framework/multi_tensor_cuda.h"

namespace ampgrad::amp::kernels::cuda {

namespace {

using namespace ::ampgrad::cuda;  // the device helpers of framework/cuda_helpers.h
using UnscaleChunk = multi_tensor::Chunk<kUnscaleLists>;

// Each chunk's out (float32) = its grad * inv_scale, the product in double rounded once; found_inf
// (one float, zeroed) is set to 1 when any result is inf/NaN.
struct Unscale {
  double inv_scale;
  float* found_inf;
  __device__ void operator()(const UnscaleChunk& c) const {
    float* out = static_cast<float*>(c.data[kUnscaleOut]);
    bool bad = false;
    multi_tensor::visit_floating(c.dtype[kUnscaleGrad], [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* g = static_cast<const T*>(c.data[kUnscaleGrad]);
      for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) {
        const float v = static_cast<float>(static_cast<double>(dload(g[i])) * inv_scale);
        bad |= !isfinite(v);
        out[i] = v;
      }
    });
    if (bad) *found_inf = 1.0f;  // benign race: every writer stores the same value
  }
};

inline constexpr int kCountWords = sizeof(GradCounts) / sizeof(unsigned long long);
inline constexpr int kMaxAbsWord = offsetof(GradCounts, max_abs) / sizeof(unsigned long long);

// As Unscale without the flag (the counts hold it; out may be null: measure only), and
// counts[chunk.tensor] receives the chunk's counts: the block counts in shared memory, then adds
// its totals with one global atomic per nonzero word. max_abs is a non-negative double, whose bits
// order as integers.
struct UnscaleAndMeasure {
  double inv_scale;
  FormatTable formats;
  GradCounts* counts;
  __device__ void operator()(const UnscaleChunk& c) const {
    __shared__ GradCounts block;
    auto* words = reinterpret_cast<unsigned long long*>(&block);
    for (int i = threadIdx.x; i < kCountWords; i += blockDim.x) words[i] = 0;
    __syncthreads();
    const auto add = [](int64_t& field, int64_t k) {
      atomicAdd(reinterpret_cast<unsigned long long*>(&field), static_cast<unsigned long long>(k));
    };
    double local_max = 0;
    const auto keep_max = [&local_max](double a) { local_max = fmax(local_max, a); };
    float* out = static_cast<float*>(c.data[kUnscaleOut]);
    multi_tensor::visit_floating(c.dtype[kUnscaleGrad], [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* g = static_cast<const T*>(c.data[kUnscaleGrad]);
      for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) {
        const double gd = static_cast<double>(dload(g[i]));
        const double vd = gd * inv_scale;
        const float v = static_cast<float>(vd);  // rounded as Unscale rounds it
        if (out != nullptr) out[i] = v;
        count_value(gd, vd, v, formats, block, add, keep_max);
      }
    });
    atomicMax(&words[kMaxAbsWord], static_cast<unsigned long long>(__double_as_longlong(local_max)));
    __syncthreads();
    auto* global = reinterpret_cast<unsigned long long*>(counts + c.tensor);
    for (int i = threadIdx.x; i < kCountWords; i += blockDim.x) {
      if (i == kMaxAbsWord) {
        atomicMax(&global[i], words[i]);
      } else if (words[i] != 0) {
        atomicAdd(&global[i], words[i]);
      }
    }
    __syncthreads();  // the block's next chunk zeroes `block` again
  }
};

}  // namespace

bool unscale_and_check(const UnscaleChunks& chunks, double inv_scale) {
  Tensor found_inf = zeros({1}, DType::kFloat32, Device::kCUDA);
  multi_tensor::apply_cuda(chunks, Unscale{inv_scale, found_inf.data<float>()}, "unscale (multi-tensor)");
  found_inf.bump_version();
  // The one host sync of a CUDA training step: GradScaler::step must return whether it stepped
  // (a bool on the host), so the device flag is read back here, once per optimizer per iteration.
  return found_inf.item() != 0.0f;
}

bool unscale_check_and_measure(const UnscaleChunks& chunks, double inv_scale, const FormatTable& formats,
                               GradCounts* counts, size_t tensors) {
  static_assert(sizeof(GradCounts) % sizeof(int64_t) == 0, "GradCounts must be whole int64 words");
  constexpr int64_t kWords = sizeof(GradCounts) / sizeof(int64_t);
  Tensor device_counts = zeros({static_cast<int64_t>(tensors) * kWords}, DType::kInt64, Device::kCUDA);
  multi_tensor::apply_cuda(
      chunks, UnscaleAndMeasure{inv_scale, formats, static_cast<GradCounts*>(device_counts.data_ptr())},
      "unscale and measure (multi-tensor)");
  device_counts.bump_version();
  const Tensor host = device_counts.to(Device::kCPU);  // the one host sync: the counts hold the flag
  const auto* bytes = static_cast<const char*>(host.data_ptr());
  bool bad = false;
  for (size_t k = 0; k < tensors; ++k) {
    std::memcpy(&counts[k], bytes + k * sizeof(GradCounts), sizeof(GradCounts));
    bad |= counts[k].unscaled_nonfinite > 0;
  }
  return bad;
}

}  // namespace ampgrad::amp::kernels::cuda
