// Multi-tensor unscale + inf/NaN check in ONE launch for any model size: the host cuts every
// gradient into chunks, uploads the chunk table once per call (through pinned memory, no host
// wait), and the blocks walk the table with a grid-stride loop. The measuring variant (gradient
// statistics, every N steps) passes its table by value instead, kChunksPerLaunch chunks a launch,
// and also counts each chunk's values (grad_counts.h).
#include "amp/unscale_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "framework/cuda_check.h"
#include "framework/cuda_helpers.h"
#include "framework/device_cuda.h"
#include "framework/error.h"

namespace ampgrad::amp::kernels::cuda {

namespace {

using namespace ::ampgrad::cuda;  // the device helpers of framework/cuda_helpers.h

inline constexpr int64_t kChunk = 16384;

/// One block's work: n elements of grad (of dtype) starting at the chunk, unscaled into out (null:
/// measure only); index: which tensor of the list (where the measuring kernel adds its counts).
struct Chunk {
  const void* grad;
  float* out;
  int64_t n;
  DType dtype;
  int32_t index;
};
static_assert(sizeof(Chunk) == 32, "the chunk table's size assumes 32-byte chunks");

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

// chunks is (count): chunk c's out (float32) = its in * inv_scale; found_inf is (1), set to 1 when
// any result is inf/NaN. Block b handles chunks b, b + gridDim.x, ...
__global__ void unscale_chunks_kernel(const TensorChunk* chunks, int64_t count, double inv_scale, float* found_inf) {
  bool bad = false;
  for (int64_t c = blockIdx.x; c < count; c += gridDim.x) {
    const TensorChunk chunk = chunks[c];
    float* out = static_cast<float*>(chunk.out);
    switch (chunk.dtype) {
      case DType::kFloat32: bad |= unscale_span(static_cast<const float*>(chunk.in), out, chunk.n, inv_scale); break;
      case DType::kFloat16: bad |= unscale_span(static_cast<const __half*>(chunk.in), out, chunk.n, inv_scale); break;
      case DType::kBFloat16:
        bad |= unscale_span(static_cast<const __nv_bfloat16*>(chunk.in), out, chunk.n, inv_scale);
        break;
      case DType::kFloat64: bad |= unscale_span(static_cast<const double*>(chunk.in), out, chunk.n, inv_scale); break;
      default: break;  // refused on the host
    }
  }
  if (bad) *found_inf = 1.0f;  // benign race: every writer stores the same value
}

template <typename T>
__device__ bool measure_span(const T* g, float* out, int64_t n, double inv_scale, const FormatTable& t,
                             GradCounts& block, double& local_max) {
  const auto add = [](int64_t& field, int64_t k) {
    atomicAdd(reinterpret_cast<unsigned long long*>(&field), static_cast<unsigned long long>(k));
  };
  const auto keep_max = [&local_max](double a) { local_max = fmax(local_max, a); };
  bool bad = false;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double gd = static_cast<double>(dload(g[i]));
    const double vd = gd * inv_scale;
    const float v = static_cast<float>(vd);  // rounded as unscale_span rounds it
    if (out != nullptr) out[i] = v;
    bad |= !isfinite(v);
    count_value(gd, vd, v, t, block, add, keep_max);
  }
  return bad;
}

inline constexpr int kCountWords = sizeof(GradCounts) / sizeof(unsigned long long);
inline constexpr int kMaxAbsWord = offsetof(GradCounts, max_abs) / sizeof(unsigned long long);

// As unscale_chunks_kernel (found_inf may be null), and counts[chunk.index] (grads of the list)
// receives the chunk's counts: a block counts in shared memory, then adds its totals with one
// global atomic per nonzero word. max_abs is a non-negative double, whose bits order as integers.
__global__ void measure_chunks_kernel(const ChunkTable table, double inv_scale, float* found_inf,
                                      const FormatTable formats, GradCounts* counts) {
  __shared__ GradCounts block;
  auto* words = reinterpret_cast<unsigned long long*>(&block);
  for (int i = threadIdx.x; i < kCountWords; i += blockDim.x) words[i] = 0;
  __syncthreads();
  const Chunk c = table.chunks[blockIdx.x];
  double local_max = 0;
  bool bad = false;
  switch (c.dtype) {
    case DType::kFloat32:
      bad = measure_span(static_cast<const float*>(c.grad), c.out, c.n, inv_scale, formats, block, local_max);
      break;
    case DType::kFloat16:
      bad = measure_span(static_cast<const __half*>(c.grad), c.out, c.n, inv_scale, formats, block, local_max);
      break;
    case DType::kBFloat16:
      bad = measure_span(static_cast<const __nv_bfloat16*>(c.grad), c.out, c.n, inv_scale, formats, block, local_max);
      break;
    case DType::kFloat64:
      bad = measure_span(static_cast<const double*>(c.grad), c.out, c.n, inv_scale, formats, block, local_max);
      break;
    default: break;
  }
  atomicMax(&words[kMaxAbsWord], static_cast<unsigned long long>(__double_as_longlong(local_max)));
  if (bad && found_inf != nullptr) *found_inf = 1.0f;  // benign race: every writer stores the same value
  __syncthreads();
  auto* global = reinterpret_cast<unsigned long long*>(counts + c.index);
  for (int i = threadIdx.x; i < kCountWords; i += blockDim.x) {
    if (i == kMaxAbsWord) {
      atomicMax(&global[i], words[i]);
    } else if (words[i] != 0) {
      atomicAdd(&global[i], words[i]);
    }
  }
}

// Cuts every tensor into chunks of kChunk elements (outs null: no output pointers).
std::vector<Chunk> make_chunks(const std::vector<Tensor>& grads, std::vector<Tensor>* outs) {
  std::vector<Chunk> chunks;
  for (size_t k = 0; k < grads.size(); ++k) {
    const Tensor& g = grads[k];
    if (outs != nullptr) {
      Tensor& o = (*outs)[k];
      AG_CHECK(g.device() == Device::kCUDA && o.device() == Device::kCUDA && is_floating(g.dtype()) &&
                   o.dtype() == DType::kFloat32 && o.numel() == g.numel(),
               "unscale (CUDA): cannot unscale ", g.to_string(), " into ", o.to_string());
    } else {
      AG_CHECK(g.device() == Device::kCUDA && is_floating(g.dtype()), "gradient statistics (CUDA): cannot measure ",
               g.to_string());
    }
    const size_t elem = element_size(g.dtype());
    for (int64_t start = 0; start < g.numel(); start += kChunk) {
      chunks.push_back({.grad = static_cast<const char*>(g.data_ptr()) + start * static_cast<int64_t>(elem),
                        .out = outs != nullptr ? (*outs)[k].data<float>() + start : nullptr,
                        .n = std::min(kChunk, g.numel() - start),
                        .dtype = g.dtype(),
                        .index = static_cast<int32_t>(k)});
    }
  }
  return chunks;
}

// The measuring launches: counts (int64 on CUDA, one GradCounts per gradient, zeroed) receives the
// counts; outs null: nothing is written and found_inf is null too. Does not wait for the GPU.
void unscale_check_and_measure_multi(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>* outs,
                                     Tensor* found_inf, const FormatTable& formats, Tensor& counts) {
  AG_CHECK(outs == nullptr || outs->size() == grads.size(), "unscale (CUDA): ", grads.size(), " gradients but ",
           outs->size(), " outputs");
  AG_CHECK(found_inf == nullptr || (found_inf->device() == Device::kCUDA && found_inf->dtype() == DType::kFloat32 &&
                                    found_inf->numel() == 1),
           "unscale (CUDA): found_inf must be one float32 element on CUDA, got ", found_inf->to_string());
  AG_CHECK(counts.device() == Device::kCUDA && counts.dtype() == DType::kInt64 &&
               counts.numel() * 8 == static_cast<int64_t>(grads.size() * sizeof(GradCounts)),
           "gradient statistics (CUDA): counts must be int64 on CUDA with ", grads.size() * sizeof(GradCounts) / 8,
           " elements, got ", counts.to_string());
  const std::vector<Chunk> chunks = make_chunks(grads, outs);
  auto* device_counts = static_cast<GradCounts*>(counts.data_ptr());
  for (size_t first = 0; first < chunks.size(); first += kChunksPerLaunch) {
    const size_t count = std::min<size_t>(kChunksPerLaunch, chunks.size() - first);
    ChunkTable table{};
    std::copy(chunks.begin() + first, chunks.begin() + first + count, table.chunks);
    measure_chunks_kernel<<<static_cast<unsigned int>(count), kThreads>>>(
        table, inv_scale, found_inf != nullptr ? found_inf->data<float>() : nullptr, formats, device_counts);
    AG_CUDA_CHECK_LAUNCH("measure_chunks_kernel");
  }
  if (outs != nullptr) {
    for (Tensor& o : *outs) o.bump_version();
  }
  if (found_inf != nullptr) found_inf->bump_version();
  counts.bump_version();
}

// outs[k] = grads[k] * inv_scale in ONE launch over the chunk table of every tensor; found_inf (one
// float32 on CUDA, zeroed) is set to 1 if any result is inf/NaN. Does not wait for the GPU.
void unscale_and_check_multi(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>& outs,
                             Tensor& found_inf) {
  AG_CHECK(grads.size() == outs.size(), "unscale (CUDA): ", grads.size(), " gradients but ", outs.size(), " outputs");
  AG_CHECK(found_inf.device() == Device::kCUDA && found_inf.dtype() == DType::kFloat32 && found_inf.numel() == 1,
           "unscale (CUDA): found_inf must be one float32 element on CUDA, got ", found_inf.to_string());
  std::vector<TensorChunk> chunks;
  for (size_t k = 0; k < grads.size(); ++k) {
    const Tensor& g = grads[k];
    Tensor& o = outs[k];
    AG_CHECK(g.device() == Device::kCUDA && o.device() == Device::kCUDA && o.dtype() == DType::kFloat32 &&
                 o.numel() == g.numel() && is_floating(g.dtype()),
             "unscale (CUDA): cannot unscale ", g.to_string(), " into ", o.to_string());
    append_chunks(chunks, g.data_ptr(), g.dtype(), o.data<float>(), sizeof(float), g.numel());
  }
  if (!chunks.empty()) {
    const size_t nbytes = chunks.size() * sizeof(TensorChunk);
    auto* table = static_cast<TensorChunk*>(upload_async(chunks.data(), nbytes));
    unscale_chunks_kernel<<<chunk_blocks(chunks.size()), kThreads>>>(table, static_cast<int64_t>(chunks.size()),
                                                                     inv_scale, found_inf.data<float>());
    caching_allocator().deallocate(table, nbytes);  // stream-ordered: reused only after the kernel
    AG_CUDA_CHECK_LAUNCH("unscale_chunks_kernel");
  }
  for (Tensor& o : outs) o.bump_version();
  found_inf.bump_version();
}

}  // namespace

bool unscale_and_check(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>& outs) {
  Tensor found_inf = zeros({1}, DType::kFloat32, Device::kCUDA);
  unscale_and_check_multi(grads, inv_scale, outs, found_inf);
  // The one host sync of a CUDA training step: GradScaler::step must return whether it stepped
  // (a bool on the host), so the device flag is read back here, once per optimizer per iteration.
  return found_inf.item() != 0.0f;
}

bool unscale_check_and_measure(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>* outs,
                               const FormatTable& formats, GradCounts* counts) {
  static_assert(sizeof(GradCounts) % sizeof(int64_t) == 0, "GradCounts must be whole int64 words");
  constexpr int64_t kWords = sizeof(GradCounts) / sizeof(int64_t);
  Tensor device_counts = zeros({static_cast<int64_t>(grads.size()) * kWords}, DType::kInt64, Device::kCUDA);
  Tensor found_inf;
  if (outs != nullptr) found_inf = zeros({1}, DType::kFloat32, Device::kCUDA);
  unscale_check_and_measure_multi(grads, inv_scale, outs, outs != nullptr ? &found_inf : nullptr, formats,
                                  device_counts);
  // One host sync: the counts (and with them the flag) come back together.
  const Tensor host = device_counts.to(Device::kCPU);
  const auto* words = static_cast<const char*>(host.data_ptr());
  bool bad = false;
  for (size_t k = 0; k < grads.size(); ++k) {
    std::memcpy(&counts[k], words + k * sizeof(GradCounts), sizeof(GradCounts));
    bad |= counts[k].unscaled_nonfinite > 0;
  }
  return bad;
}

}  // namespace ampgrad::amp::kernels::cuda
