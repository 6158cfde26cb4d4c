// CPU GEMM. float, float16 and bfloat16 go through the packed GEMM in linear_gemm_cpu.cc: the
// 16-bit types follow tensor-core semantics (FP16 operands widened to float, BF16 ones too or
// multiplied as pairs by VDPBF16PS on AVX512_BF16; FP32 accumulation, the result rounded once).
// FP8 operands (the FP8 linear's) are decoded exactly while they are packed, into a float32 result.
// float64, which only references and tests use, goes through Eigen. A batch runs its products on
// the pool, one per task, when there are enough of them; otherwise one after the other, each
// threaded inside.
#include <Eigen/Core>

#include "framework/error.h"
#include "framework/parallel.h"
#include "ops/linear/linear_gemm_cpu.h"
#include "ops/linear/linear_kernels.h"

namespace ampgrad::kernels::cpu {

namespace {

using RowMajorD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// One matrix of a (possibly batched) operand: data, stored rows and columns.
struct Matrix {
  const void* data;
  int64_t rows, cols;
};

void gemm_double(const Matrix& a, Transpose ta, const Matrix& b, Transpose tb, const double* bias, double* out,
                 int64_t m, int64_t n) {
  Eigen::Map<const RowMajorD> A(static_cast<const double*>(a.data), a.rows, a.cols);
  Eigen::Map<const RowMajorD> B(static_cast<const double*>(b.data), b.rows, b.cols);
  Eigen::Map<RowMajorD> C(out, m, n);
  const bool at = ta == Transpose::kYes, bt = tb == Transpose::kYes;
  if (!at && !bt) C.noalias() = A * B;
  if (!at && bt) C.noalias() = A * B.transpose();
  if (at && !bt) C.noalias() = A.transpose() * B;
  if (at && bt) C.noalias() = A.transpose() * B.transpose();
  if (bias != nullptr) C.rowwise() += Eigen::Map<const Eigen::Matrix<double, 1, Eigen::Dynamic>>(bias, n);
}

// op(m) as a strided view: a transpose swaps the strides of the row-major [rows, cols] data.
MatrixView view(const Matrix& m, DType dtype, Transpose trans) {
  const bool transposed = trans == Transpose::kYes;
  return {m.data, dtype, transposed ? 1 : m.cols, transposed ? m.cols : 1};
}

int64_t batch_of(const Tensor& t) { return t.dim() == 3 ? t.size(0) : 1; }

// Matrix i of a batched operand (a shared single matrix for every i).
Matrix matrix(const Tensor& t, int64_t i) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  const int64_t index = batch_of(t) == 1 ? 0 : i;
  return {static_cast<const char*>(t.data_ptr()) + index * rows * cols * static_cast<int64_t>(element_size(t.dtype())),
          rows, cols};
}

}  // namespace

void gemm(const Tensor& a, Transpose trans_a, const Tensor& b, Transpose trans_b, const Tensor& bias, Tensor& out) {
  const int64_t batch = batch_of(out);
  const int64_t m = out.size(-2), n = out.size(-1);
  const int64_t k = trans_a == Transpose::kYes ? a.size(-2) : a.size(-1);
  const DType dtype = out.dtype();
  const size_t elem = element_size(dtype);
  AG_CHECK(dtype != DType::kFloat64 || (a.dtype() == dtype && b.dtype() == dtype),
           "gemm: a float64 product takes float64 operands, got ", a.dtype(), " and ", b.dtype());
  // A shared b under a batch of untransposed a: the batch is one GEMM over the stacked rows.
  if (batch > 1 && batch_of(b) == 1 && batch_of(a) == batch && trans_a == Transpose::kNo) {
    const Matrix stacked{a.data_ptr(), batch * m, k}, shared = matrix(b, 0);
    if (dtype == DType::kFloat64) {
      return gemm_double(stacked, trans_a, shared, trans_b, bias.defined() ? bias.data<double>() : nullptr,
                         out.data<double>(), batch * m, n);
    }
    const MatrixView bias_view = bias.defined() ? MatrixView{bias.data_ptr(), bias.dtype(), 0, 1} : MatrixView{};
    return sgemm(batch * m, n, k, view(stacked, a.dtype(), trans_a), view(shared, b.dtype(), trans_b), bias_view,
                 out.data_ptr(), dtype);
  }
  const auto one = [&](int64_t i) {
    void* c = static_cast<char*>(out.data_ptr()) + i * m * n * static_cast<int64_t>(elem);
    if (dtype == DType::kFloat64) {
      return gemm_double(matrix(a, i), trans_a, matrix(b, i), trans_b, bias.defined() ? bias.data<double>() : nullptr,
                         static_cast<double*>(c), m, n);
    }
    const MatrixView bias_view = bias.defined() ? MatrixView{bias.data_ptr(), bias.dtype(), 0, 1} : MatrixView{};
    sgemm(m, n, k, view(matrix(a, i), a.dtype(), trans_a), view(matrix(b, i), b.dtype(), trans_b), bias_view, c, dtype);
  };
  // Many small products (attention's per-head GEMMs): one per task, each single-threaded (a GEMM
  // inside a pool task runs serially). Few large ones: in turn, each spread over the pool.
  if (batch >= num_threads()) {
    parallel_for(batch, one);
  } else {
    for (int64_t i = 0; i < batch; ++i) one(i);
  }
}

}  // namespace ampgrad::kernels::cpu
