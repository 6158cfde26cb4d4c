// CPU GEMM through Eigen, single-threaded per chunk, chunks spread over the pool (parallel_cpu.h).
// float16 follows tensor-core semantics: the inputs are widened to float
// in blocks, multiplied by Eigen's float GEMM (FP32 accumulation) and the result rounded to half
// once. Eigen's own half GEMM is ~100x slower and accumulates in half, so it is not used.
#include <Eigen/Core>
#include <algorithm>
#include <memory>
#include <type_traits>

#include "framework/error.h"
#include "ops/cpu/kernels_cpu.h"
#include "ops/cpu/parallel_cpu.h"

namespace ampgrad::kernels::cpu {

namespace {

template <typename T>
using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Below this many FLOP a GEMM stays on the calling thread: waking a helper costs more than it saves.
constexpr double kParallelFlop = 8e6;
// Chunks are multiples of this many rows/columns (a multiple of Eigen's register tile).
constexpr int64_t kChunkAlign = 32;

// c = a b (+ bias) for Eigen expressions a [M,K], b [K,N] and c [M,N]. Large products are cut along
// the longer side of c into chunks of single-threaded Eigen GEMMs on the pool: unlike Eigen's own
// OpenMP GEMM, whose threads spin-wait on each other, a slow core then delays only its chunk.
template <typename A, typename B, typename C, typename Bias>
void gemm_chunked(const A& a, const B& b, C& c, const Bias* bias) {
  const int64_t m = c.rows(), n = c.cols(), k = a.cols();
  const bool split_rows = m >= n;
  const int64_t extent = split_rows ? m : n;
  int64_t chunks = 1;
  if (2.0 * m * n * k >= kParallelFlop) {
    // Two chunks per thread: enough to rebalance when a core is busy, few enough to pack b rarely.
    const int64_t len = std::max<int64_t>(kChunkAlign, (extent / (2 * pool_threads()) + kChunkAlign - 1) /
                                                           kChunkAlign * kChunkAlign);
    chunks = (extent + len - 1) / len;
  }
  const int64_t len = (extent + chunks - 1) / chunks;
  parallel_for(chunks, [&](int64_t chunk) {
    const int64_t lo = chunk * len, size = std::min(len, extent - lo);
    if (split_rows) {
      auto rows = c.middleRows(lo, size);
      rows.noalias() = a.middleRows(lo, size) * b;
      if (bias != nullptr) rows.rowwise() += *bias;
    } else {
      auto cols = c.middleCols(lo, size);
      cols.noalias() = a * b.middleCols(lo, size);
      if (bias != nullptr) cols.rowwise() += bias->segment(lo, size);
    }
  });
}

// c[M,N] = op(a) op(b) (+ bias) for T in {float, double}; a and b are stored row-major as given.
template <typename T>
void gemm_native(const T* a, Transpose ta, int64_t a_rows, int64_t a_cols, const T* b, Transpose tb,
                 int64_t b_rows, int64_t b_cols, const T* bias, T* c, int64_t m, int64_t n) {
  Eigen::Map<const RowMajor<T>> A(a, a_rows, a_cols);
  Eigen::Map<const RowMajor<T>> B(b, b_rows, b_cols);
  Eigen::Map<RowMajor<T>> C(c, m, n);
  const Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>> bias_row(bias, bias != nullptr ? n : 0);
  const auto* bias_ptr = bias != nullptr ? &bias_row : nullptr;
  const bool at = ta == Transpose::kYes;
  const bool bt = tb == Transpose::kYes;
  if (!at && !bt) gemm_chunked(A, B, C, bias_ptr);
  if (!at && bt) gemm_chunked(A, B.transpose(), C, bias_ptr);
  if (at && !bt) gemm_chunked(A.transpose(), B, C, bias_ptr);
  if (at && bt) gemm_chunked(A.transpose(), B.transpose(), C, bias_ptr);
}

// Scratch for the half path, reused across calls so a training step does not hit the heap.
// It only grows and is never value-initialised: a std::vector resized up and down between GEMMs
// of different shapes zero-filled megabytes per call (a memset as large as the conversions).
float* scratch(int slot, int64_t n) {
  struct Buffer {
    std::unique_ptr<float[]> data;
    int64_t capacity = 0;
  };
  thread_local Buffer buffers[4];
  Buffer& buffer = buffers[slot];
  if (buffer.capacity < n) {
    buffer.data.reset(new float[static_cast<size_t>(n)]);
    buffer.capacity = n;
  }
  return buffer.data.get();
}

// Element conversions in chunks over the pool: at 1M elements one core is the bottleneck.
constexpr int64_t kConvertChunk = int64_t{1} << 17;

template <typename Src, typename Dst>
void convert(const Src* src, Dst* dst, int64_t n) {
  const int64_t chunks = (n + kConvertChunk - 1) / kConvertChunk;
  parallel_for(chunks, [&](int64_t c) {
    const int64_t lo = c * kConvertChunk;
    if constexpr (std::is_same_v<Src, Half>) {
      half_to_float(src + lo, dst + lo, static_cast<size_t>(std::min(kConvertChunk, n - lo)));
    } else {
      float_to_half(src + lo, dst + lo, static_cast<size_t>(std::min(kConvertChunk, n - lo)));
    }
  });
}

const float* widened(const Tensor& t, int slot) {
  float* buffer = scratch(slot, t.numel());
  convert(t.data<Half>(), buffer, t.numel());
  return buffer;
}

}  // namespace

void gemm(const Tensor& a, Transpose trans_a, const Tensor& b, Transpose trans_b, const Tensor& bias, Tensor& out) {
  const int64_t m = out.size(0), n = out.size(1);
  const int64_t a_rows = a.size(0), a_cols = a.size(1), b_rows = b.size(0), b_cols = b.size(1);
  switch (out.dtype()) {
    case DType::kFloat32:
      gemm_native<float>(a.data<float>(), trans_a, a_rows, a_cols, b.data<float>(), trans_b, b_rows, b_cols,
                         bias.defined() ? bias.data<float>() : nullptr, out.data<float>(), m, n);
      break;
    case DType::kFloat64:
      gemm_native<double>(a.data<double>(), trans_a, a_rows, a_cols, b.data<double>(), trans_b, b_rows, b_cols,
                          bias.defined() ? bias.data<double>() : nullptr, out.data<double>(), m, n);
      break;
    case DType::kFloat16: {
      float* c = scratch(3, m * n);
      gemm_native<float>(widened(a, 0), trans_a, a_rows, a_cols, widened(b, 1), trans_b, b_rows, b_cols,
                         bias.defined() ? widened(bias, 2) : nullptr, c, m, n);
      convert(c, out.data<Half>(), m * n);
      break;
    }
  }
}

}  // namespace ampgrad::kernels::cpu

