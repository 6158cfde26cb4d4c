// CPU GEMM through Eigen. float16 follows tensor-core semantics: the inputs are widened to float
// in blocks, multiplied by Eigen's float GEMM (FP32 accumulation) and the result rounded to half
// once. Eigen's own half GEMM is ~100x slower and accumulates in half, so it is not used.
#include <Eigen/Core>
#include <vector>

#include "framework/error.h"
#include "ops/cpu/kernels_cpu.h"
#include "ops/ops.h"

namespace ampgrad::kernels::cpu {

namespace {

template <typename T>
using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// c[M,N] = op(a) op(b) (+ bias) for T in {float, double}; a and b are stored row-major as given.
template <typename T>
void gemm_native(const T* a, Transpose ta, int64_t a_rows, int64_t a_cols, const T* b, Transpose tb,
                 int64_t b_rows, int64_t b_cols, const T* bias, T* c, int64_t m, int64_t n) {
  Eigen::Map<const RowMajor<T>> A(a, a_rows, a_cols);
  Eigen::Map<const RowMajor<T>> B(b, b_rows, b_cols);
  Eigen::Map<RowMajor<T>> C(c, m, n);
  const bool at = ta == Transpose::kYes;
  const bool bt = tb == Transpose::kYes;
  if (!at && !bt) C.noalias() = A * B;
  if (!at && bt) C.noalias() = A * B.transpose();
  if (at && !bt) C.noalias() = A.transpose() * B;
  if (at && bt) C.noalias() = A.transpose() * B.transpose();
  if (bias != nullptr) C.rowwise() += Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(bias, n);
}

// Scratch for the half path, reused across calls so a training step does not hit the heap.
std::vector<float>& scratch(int slot) {
  thread_local std::vector<float> buffers[4];
  return buffers[slot];
}

const float* widened(const Tensor& t, int slot) {
  std::vector<float>& buffer = scratch(slot);
  buffer.resize(static_cast<size_t>(t.numel()));
  half_to_float(t.data<Half>(), buffer.data(), buffer.size());
  return buffer.data();
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
      std::vector<float>& c = scratch(3);
      c.resize(static_cast<size_t>(m * n));
      gemm_native<float>(widened(a, 0), trans_a, a_rows, a_cols, widened(b, 1), trans_b, b_rows, b_cols,
                         bias.defined() ? widened(bias, 2) : nullptr, c.data(), m, n);
      float_to_half(c.data(), out.data<Half>(), c.size());
      break;
    }
  }
}

}  // namespace ampgrad::kernels::cpu

namespace ampgrad {

// Eigen parallelises its GEMM with OpenMP; these set and read its thread count.
void set_num_threads(int num_threads) {
  AG_CHECK(num_threads >= 1, "set_num_threads: need at least 1 thread, got ", num_threads);
  Eigen::setNbThreads(num_threads);
}

int num_threads() { return Eigen::nbThreads(); }

}  // namespace ampgrad
