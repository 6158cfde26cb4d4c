// Multi-tensor unscale + inf/NaN check: the host cuts every gradient into chunks of kChunk elements
// and passes a table of {grad, out, n, dtype} by value as the kernel's argument (no upload, no
// host sync); block b handles chunk b. One launch per kChunksPerLaunch chunks: one for most models.
#include "amp/unscale.h"

#include <algorithm>
#include <cmath>

#include "framework/cuda_check.h"
#include "framework/cuda_helpers.h"
#include "framework/error.h"

namespace ampgrad::amp::cuda {

namespace {

using namespace ::ampgrad::cuda;  // the device helpers of framework/cuda_helpers.h

inline constexpr int64_t kChunk = 16384;

/// One block's work: n elements of grad (of dtype) starting at the chunk, unscaled into out.
struct Chunk {
  const void* grad;
  float* out;
  int64_t n;
  DType dtype;
};

template <typename T>
__device__ bool unscale_span(const T* g, float* out, int64_t n, double inv_scale) {
  bool bad = false;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = static_cast<float>(static_cast<double>(dload(g[i])) * inv_scale);
    bad |= !isfinite(v);
    out[i] = v;
  }
  return bad;
}

// 96 chunks of 32 bytes stay under the 4 KiB kernel-parameter limit of every CUDA version.
inline constexpr int kChunksPerLaunch = 96;
struct ChunkTable {
  Chunk chunks[kChunksPerLaunch];
};

// table.chunks is (gridDim.x) used entries; found_inf is (1): set to 1 when any unscaled value is inf/NaN.
__global__ void unscale_chunks_kernel(const ChunkTable table, double inv_scale, float* found_inf) {
  const Chunk c = table.chunks[blockIdx.x];
  bool bad = false;
  switch (c.dtype) {
    case DType::kFloat32: bad = unscale_span(static_cast<const float*>(c.grad), c.out, c.n, inv_scale); break;
    case DType::kFloat16: bad = unscale_span(static_cast<const __half*>(c.grad), c.out, c.n, inv_scale); break;
    case DType::kFloat64: bad = unscale_span(static_cast<const double*>(c.grad), c.out, c.n, inv_scale); break;
  }
  if (bad) *found_inf = 1.0f;  // benign race: every writer stores the same value
}

}  // namespace

void unscale_and_check_multi(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>& outs,
                             Tensor& found_inf) {
  AG_CHECK(grads.size() == outs.size(), "unscale (CUDA): ", grads.size(), " gradients but ", outs.size(), " outputs");
  AG_CHECK(found_inf.device() == Device::kCUDA && found_inf.dtype() == DType::kFloat32 && found_inf.numel() == 1,
           "unscale (CUDA): found_inf must be one float32 element on CUDA, got ", found_inf.to_string());
  std::vector<Chunk> chunks;
  for (size_t k = 0; k < grads.size(); ++k) {
    const Tensor& g = grads[k];
    Tensor& o = outs[k];
    AG_CHECK(g.device() == Device::kCUDA && o.device() == Device::kCUDA && o.dtype() == DType::kFloat32 &&
                 o.numel() == g.numel(),
             "unscale (CUDA): cannot unscale ", g.to_string(), " into ", o.to_string());
    const size_t elem = element_size(g.dtype());
    for (int64_t start = 0; start < g.numel(); start += kChunk) {
      chunks.push_back({.grad = static_cast<const char*>(g.data_ptr()) + start * static_cast<int64_t>(elem),
                        .out = o.data<float>() + start,
                        .n = std::min(kChunk, g.numel() - start),
                        .dtype = g.dtype()});
    }
  }
  for (size_t first = 0; first < chunks.size(); first += kChunksPerLaunch) {
    const size_t count = std::min<size_t>(kChunksPerLaunch, chunks.size() - first);
    ChunkTable table{};
    std::copy(chunks.begin() + first, chunks.begin() + first + count, table.chunks);
    unscale_chunks_kernel<<<static_cast<unsigned int>(count), kThreads>>>(table, inv_scale, found_inf.data<float>());
    AG_CUDA_CHECK_LAUNCH();
  }
  for (Tensor& o : outs) o.bump_version();
  found_inf.bump_version();
}

}  // namespace ampgrad::amp::cuda
