// Reductions on CUDA. sum_to splits x's dimensions into kept ones (one per output element) and
// reduced ones, cuts the reduced range into chunks fixed by the shape, writes one double partial
// per (chunk, output) and adds the partials in chunk order: deterministic, and tiled so that
// neighbouring threads read neighbouring elements whether the innermost dimension is kept (bias
// gradients) or reduced (row sums). max_along scans one dimension per output element.
// sum_of_squares and clip_by_norm_ are multi-tensor passes (framework/multi_tensor_cuda.h).
#include <algorithm>

#include "framework/cuda_check.h"
#include "framework/cuda_helpers.h"
#include "framework/device_cuda.h"
#include "framework/multi_tensor_cuda.h"
#include "ops/reduce/reduce_cuda.h"
#include "ops/reduce/reduce_kernels.h"
#include "ops/strided.h"

namespace ampgrad::kernels::cuda {

namespace {

using namespace ::ampgrad::cuda;  // the device helpers of framework/cuda_helpers.h

constexpr int64_t kChunk = 4096;   // reduced elements per partial (more when 65535 chunks are not enough)
constexpr int kTileX = 32, kTileY = 8;
// When the innermost dimension is kept, more and shorter chunks if the column tiles alone give few
// blocks (a bias gradient of 4096 columns is 128 tiles): about kTargetBlocks blocks, chunks of
// about kMinChunk terms or more. Fixed by the shape, not the GPU, so the sum stays deterministic.
constexpr int64_t kTargetBlocks = 2048, kMinChunk = 64;

struct Identity {
  __device__ double operator()(double total) const { return total; }
};

struct SumPlans {
  StridedPlan<1> kept;     // output element -> offset of its first term in x
  StridedPlan<1> reduced;  // term index -> offset from that first term
  bool inner_reduced;      // x's innermost (contiguous) dimension is summed away
};

SumPlans sum_plans(const Tensor& x, const Tensor& out) {
  const StridedPlan<2> plan =
      make_plan<2>(x.shape(), {contiguous_strides(x.shape()), broadcast_strides(out.shape(), x.shape())});
  Shape kept_sizes, kept_strides, reduced_sizes, reduced_strides;
  for (int d = 0; d < plan.rank; ++d) {
    const bool kept = plan.strides[1][d] != 0;
    (kept ? kept_sizes : reduced_sizes).push_back(plan.sizes[d]);
    (kept ? kept_strides : reduced_strides).push_back(plan.strides[0][d]);
  }
  return {make_plan<1>(kept_sizes, {kept_strides}), make_plan<1>(reduced_sizes, {reduced_strides}),
          plan.rank > 0 && plan.strides[1][plan.rank - 1] == 0};
}

template <typename T>
__device__ double term(const T* x, const StridedPlan<1>& reduced, int64_t base, int64_t r) {
  if (reduced.rank == 1) return static_cast<double>(dload(x[base + reduced.offset[0] + r * reduced.strides[0][0]]));
  int64_t off[1];
  plan_offsets(reduced, r, off);
  return static_cast<double>(dload(x[base + off[0]]));
}

// The innermost dimension is reduced: block (o, c) sums chunk c of output o's terms.
// partials is (chunks, n_out).
template <typename T>
__global__ void sum_rows_kernel(const T* x, StridedPlan<1> kept, StridedPlan<1> reduced, int64_t chunk,
                                double* partials) {
  using BlockReduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename BlockReduce::TempStorage temp;
  const int64_t o = blockIdx.x, c = blockIdx.y;
  int64_t base[1];
  plan_offsets(kept, o, base);
  const int64_t r_end = min(reduced.numel, (c + 1) * chunk);
  double acc = 0.0;
  for (int64_t r = c * chunk + threadIdx.x; r < r_end; r += blockDim.x) acc += term(x, reduced, base[0], r);
  const double total = BlockReduce(temp).Sum(acc);
  if (threadIdx.x == 0) partials[c * kept.numel + o] = total;
}

// The innermost dimension is kept: a 32 x 8 tile, threads along x on neighbouring outputs, along y
// on interleaved terms of chunk blockIdx.y; the 8 rows of the tile are added in order.
template <typename T>
__global__ void sum_columns_kernel(const T* x, StridedPlan<1> kept, StridedPlan<1> reduced, int64_t chunk,
                                   double* partials) {
  __shared__ double tile[kTileY][kTileX];
  const int64_t o = blockIdx.x * int64_t{kTileX} + threadIdx.x, c = blockIdx.y;
  double acc = 0.0;
  if (o < kept.numel) {
    int64_t base[1];
    plan_offsets(kept, o, base);
    const int64_t r_end = min(reduced.numel, (c + 1) * chunk);
    for (int64_t r = c * chunk + threadIdx.y; r < r_end; r += kTileY) acc += term(x, reduced, base[0], r);
  }
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && o < kept.numel) {
    double total = 0.0;
    for (int k = 0; k < kTileY; ++k) total += tile[k][threadIdx.x];
    partials[c * kept.numel + o] = total;
  }
}

// partials is (chunks, n), out is (n): out = alpha * sum over chunks, in chunk order, rounded once.
template <typename T>
__global__ void finish_kernel(const double* partials, int64_t chunks, int64_t n, double alpha, T* out) {
  for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < n; o += int64_t{gridDim.x} * blockDim.x) {
    double total = 0.0;
    for (int64_t c = 0; c < chunks; ++c) total += partials[c * n + o];
    out[o] = dconvert<T>(alpha * total);
  }
}

// x is (outer, size, inner); values and indices are (outer, inner).
template <typename T>
__global__ void max_along_kernel(const T* x, int64_t outer, int64_t size, int64_t inner, T* values,
                                 int64_t* indices) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < outer * inner;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t o = k / inner, i = k % inner;
    const T* base = x + o * size * inner + i;
    Compute<T> best = dload(base[0]);
    int64_t index = 0;
    for (int64_t r = 1; r < size; ++r) {
      const Compute<T> v = dload(base[r * inner]);
      if (v > best || (v != v && best == best)) {  // the first maximum; the first NaN wins
        best = v;
        index = r;
      }
    }
    if (values != nullptr) values[k] = dstore<T>(best);
    indices[k] = index;
  }
}

// dy and indices are (outer, inner); dx is (outer, size, inner), zeroed before.
template <typename T>
__global__ void max_backward_kernel(const T* dy, const int64_t* indices, int64_t outer, int64_t size, int64_t inner,
                                    T* dx) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < outer * inner;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t o = k / inner, i = k % inner;
    dx[(o * size + indices[k]) * inner + i] = dy[k];
  }
}

// Each thread adds the squares of its elements of a chunk in double, then that chunk's sum to its
// total over the block's chunks; finish() reduces the block's totals into partials[blockIdx.x]
// (one per block: a fixed grid for a given table, so the order of the sum is fixed too).
struct SumOfSquares {
  double* partials;
  double acc = 0.0;
  __device__ void operator()(const multi_tensor::Chunk<1>& c) {
    double chunk = 0.0;
    multi_tensor::visit_floating(c.dtype[0], [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* x = static_cast<const T*>(c.data[0]);
      for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) {
        const double v = static_cast<double>(dload(x[i]));
        chunk += v * v;
      }
    });
    acc += chunk;
  }
  __device__ void finish() {
    using BlockReduce = cub::BlockReduce<double, kThreads>;
    __shared__ typename BlockReduce::TempStorage temp;
    const double total = BlockReduce(temp).Sum(acc);
    if (threadIdx.x == 0) partials[blockIdx.x] = total;
  }
};

// norm = sqrt(sum_sq) (sum_sq and norm are one double each), and when clipping is due every chunk
// (in place) = coeff * x + 0, with affine_kernel's rounding. Every block works the coefficient out
// from sum_sq (a few flops; it saves a launch); block 0 writes norm when it is done, a different
// element from sum_sq, so no block reads what another writes.
struct ClipByNorm {
  const double* sum_sq;
  double max_norm;
  double* norm;
  __device__ void operator()(const multi_tensor::Chunk<1>& c) const {
    const double total_norm = sqrt(*sum_sq);
    const double coeff = max_norm / (total_norm + 1e-6);  // PyTorch's epsilon, in double as on the CPU
    if (!isfinite(total_norm) || !(coeff < 1.0)) return;
    multi_tensor::visit_floating(c.dtype[0], [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* x = static_cast<T*>(c.data[0]);
      const Compute<T> scale = static_cast<Compute<T>>(coeff);
      for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) x[i] = dstore<T>(scale * dload(x[i]) + Compute<T>(0));
    });
  }
  __device__ void finish() const {
    if (blockIdx.x == 0 && threadIdx.x == 0) *norm = sqrt(*sum_sq);
  }
};

// norm = sqrt(sum_sq) when there is nothing to clip.
__global__ void write_norm_kernel(const double* sum_sq, double* norm) { *norm = sqrt(*sum_sq); }

}  // namespace

void sum_to(const Tensor& x, double alpha, Tensor& out) {
  const int64_t n_out = out.numel();
  if (n_out == 0) return;
  const SumPlans plans = sum_plans(x, out);
  const int64_t terms = plans.reduced.numel;
  int64_t chunks = (terms + kChunk - 1) / kChunk;
  if (!plans.inner_reduced) {  // a row-sum block already has 256 threads on one output's terms
    const int64_t tiles = (n_out + kTileX - 1) / kTileX;
    chunks = std::max(chunks, std::min((kTargetBlocks + tiles - 1) / tiles, terms / kMinChunk));
  }
  chunks = std::clamp<int64_t>(chunks, 1, 65535);
  const int64_t chunk = std::max<int64_t>(1, (terms + chunks - 1) / chunks);
  if (terms > 0) chunks = (terms + chunk - 1) / chunk;  // no empty trailing chunk
  Allocator& alloc = caching_allocator();
  const size_t nbytes = sizeof(double) * static_cast<size_t>(chunks * n_out);
  double* partials = static_cast<double*>(alloc.allocate(nbytes));
  visit_floating_dtype(out.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    const T* in = static_cast<const T*>(x.data_ptr());
    if (terms == 0) {
      AG_CUDA_CHECK(cudaMemsetAsync(partials, 0, nbytes, cudaStreamLegacy));  // a sum of nothing is 0
    } else if (plans.inner_reduced) {
      AG_CHECK(n_out <= 0x7fffffff, "sum (CUDA): ", n_out, " outputs exceed the grid limit");
      sum_rows_kernel<T><<<dim3(static_cast<unsigned>(n_out), static_cast<unsigned>(chunks)), kThreads>>>(
          in, plans.kept, plans.reduced, chunk, partials);
    } else {
      const int64_t tiles = (n_out + kTileX - 1) / kTileX;
      AG_CHECK(tiles <= 0x7fffffff, "sum (CUDA): ", n_out, " outputs exceed the grid limit");
      sum_columns_kernel<T><<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks)),
                              dim3(kTileX, kTileY)>>>(in, plans.kept, plans.reduced, chunk, partials);
    }
    AG_CUDA_CHECK_LAUNCH(plans.inner_reduced ? "sum_rows_kernel" : "sum_columns_kernel");
    finish_kernel<T><<<blocks_for(n_out), kThreads>>>(partials, chunks, n_out, alpha, static_cast<T*>(out.data_ptr()));
    AG_CUDA_CHECK_LAUNCH("finish_kernel");
  });
  alloc.deallocate(partials, nbytes);  // stream-ordered: a later user of the block runs after us
}

void sum_of_squares(const SquaresChunks& chunks, Tensor& out) {
  double* result = static_cast<double*>(out.data_ptr());
  if (chunks.empty()) {
    AG_CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(double), cudaStreamLegacy));  // a sum of nothing is 0
    return;
  }
  Allocator& alloc = caching_allocator();
  const unsigned int blocks = multi_tensor::launch_blocks(chunks.size());
  const size_t partial_bytes = sizeof(double) * blocks;
  auto* partials = static_cast<double*>(alloc.allocate(partial_bytes));
  multi_tensor::apply_cuda(chunks, SumOfSquares{partials}, "sum_of_squares (multi-tensor)", blocks);
  reduce_finish_kernel<double, double><<<1, kThreads>>>(partials, static_cast<int>(blocks), Identity{}, result);
  alloc.deallocate(partials, partial_bytes);  // stream-ordered: a later user of the block runs after us
  AG_CUDA_CHECK_LAUNCH("reduce_finish_kernel");
}

void clip_by_norm_(const SquaresChunks& chunks, const Tensor& sum_sq, double max_norm, Tensor& norm) {
  const auto* sum = static_cast<const double*>(sum_sq.data_ptr());
  auto* out = static_cast<double*>(norm.data_ptr());
  if (chunks.empty()) {
    write_norm_kernel<<<1, 1>>>(sum, out);
    AG_CUDA_CHECK_LAUNCH("write_norm_kernel");
    return;
  }
  multi_tensor::apply_cuda(chunks, ClipByNorm{sum, max_norm, out}, "clip_by_norm_ (multi-tensor)");
}

void max_along(const Tensor& x, int64_t dim, Tensor& values, Tensor& indices) {
  const AlongDim v = along_dim(x.shape(), dim);
  if (v.outer * v.inner == 0) return;
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    max_along_kernel<T><<<blocks_for(v.outer * v.inner), kThreads>>>(
        static_cast<const T*>(x.data_ptr()), v.outer, v.size, v.inner,
        values.defined() ? static_cast<T*>(values.data_ptr()) : nullptr, static_cast<int64_t*>(indices.data_ptr()));
    AG_CUDA_CHECK_LAUNCH("max_along_kernel");
  });
}

void max_backward(const Tensor& dy, const Tensor& indices, int64_t dim, Tensor& dx) {
  const AlongDim v = along_dim(dx.shape(), dim);
  AG_CUDA_CHECK(cudaMemsetAsync(dx.data_ptr(), 0, static_cast<size_t>(dx.numel()) * element_size(dx.dtype()),
                                cudaStreamLegacy));  // all-zero bits are +0 in every float dtype
  if (v.outer * v.inner == 0) return;
  visit_floating_dtype(dx.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    max_backward_kernel<T><<<blocks_for(v.outer * v.inner), kThreads>>>(
        static_cast<const T*>(dy.data_ptr()), static_cast<const int64_t*>(indices.data_ptr()), v.outer, v.size,
        v.inner, static_cast<T*>(dx.data_ptr()));
    AG_CUDA_CHECK_LAUNCH("max_backward_kernel");
  });
}

}  // namespace ampgrad::kernels::cuda
