// CPU GEMM. float and float16 go through the packed GEMM in linear_gemm_cpu.cc: float16 follows
// tensor-core semantics (FP16 operands widened while they are packed, FP32 accumulation, the
// result rounded to FP16 once). float64, which only references and tests use, goes through Eigen.
#include <Eigen/Core>

#include "framework/error.h"
#include "ops/linear_kernels.h"
#include "ops/linear_gemm_cpu.h"

namespace ampgrad::kernels::cpu {

namespace {

using RowMajorD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

void gemm_double(const Tensor& a, Transpose ta, const Tensor& b, Transpose tb, const Tensor& bias, Tensor& out) {
  Eigen::Map<const RowMajorD> A(a.data<double>(), a.size(0), a.size(1));
  Eigen::Map<const RowMajorD> B(b.data<double>(), b.size(0), b.size(1));
  Eigen::Map<RowMajorD> C(out.data<double>(), out.size(0), out.size(1));
  const bool at = ta == Transpose::kYes, bt = tb == Transpose::kYes;
  if (!at && !bt) C.noalias() = A * B;
  if (!at && bt) C.noalias() = A * B.transpose();
  if (at && !bt) C.noalias() = A.transpose() * B;
  if (at && bt) C.noalias() = A.transpose() * B.transpose();
  if (bias.defined()) {
    C.rowwise() += Eigen::Map<const Eigen::Matrix<double, 1, Eigen::Dynamic>>(bias.data<double>(), bias.numel());
  }
}

// op(t) as a strided view: a transpose swaps the strides of the row-major [rows, cols] data.
MatrixView view(const Tensor& t, Transpose trans) {
  const int64_t cols = t.size(1);
  const bool transposed = trans == Transpose::kYes;
  return {t.data_ptr(), t.dtype(), transposed ? 1 : cols, transposed ? cols : 1};
}

}  // namespace

void gemm(const Tensor& a, Transpose trans_a, const Tensor& b, Transpose trans_b, const Tensor& bias, Tensor& out) {
  if (out.dtype() == DType::kFloat64) return gemm_double(a, trans_a, b, trans_b, bias, out);
  const int64_t k = trans_a == Transpose::kYes ? a.size(0) : a.size(1);
  const MatrixView bias_view =
      bias.defined() ? MatrixView{bias.data_ptr(), bias.dtype(), 0, 1} : MatrixView{};
  sgemm(out.size(0), out.size(1), k, view(a, trans_a), view(b, trans_b), bias_view, out.data_ptr(), out.dtype());
}

}  // namespace ampgrad::kernels::cpu
