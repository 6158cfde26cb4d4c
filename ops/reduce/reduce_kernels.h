// Reduction kernels. Sums accumulate in double in an order fixed by the shapes alone, so their
// relative error stays near double's whatever the number of terms, and results do not depend on
// the thread count. Callers have checked shapes, dtypes and devices; outputs are preallocated and
// overwritten.
#pragma once

#include <vector>

#include "framework/device.h"
#include "framework/error.h"
#include "framework/multi_tensor.h"
#include "framework/tensor.h"

namespace ampgrad::kernels {

// out = alpha * (x summed over every dimension along which out is broadcast): out's shape
// broadcasts to x's (aligned at the last dimension, each size equal or 1), e.g. [C] or [1, T, 1]
// against [B, T, C], or [] for everything. alpha is applied in double and the result rounded once.
// Bias and broadcast gradients, sum and mean use it.
namespace cpu { void sum_to(const Tensor& x, double alpha, Tensor& out); }
namespace cuda { void sum_to(const Tensor& x, double alpha, Tensor& out); }
inline void sum_to(const Tensor& x, double alpha, Tensor& out) { AG_ON_BACKEND(out.device(), sum_to, x, alpha, out); }

// Along dimension `dim` of x (non-negative): values = the maxima and indices (int64) = the index of
// the first maximum, both shaped like x without `dim` (contiguous). A NaN counts as the maximum
// (the first NaN wins), as in PyTorch. values may be undefined (argmax).
namespace cpu { void max_along(const Tensor& x, int64_t dim, Tensor& values, Tensor& indices); }
namespace cuda { void max_along(const Tensor& x, int64_t dim, Tensor& values, Tensor& indices); }
inline void max_along(const Tensor& x, int64_t dim, Tensor& values, Tensor& indices) {
  AG_ON_BACKEND(x.device(), max_along, x, dim, values, indices);
}

// dx (x's shape) = 0 everywhere except dx at indices along `dim` = dy (the gradient of max_along).
namespace cpu { void max_backward(const Tensor& dy, const Tensor& indices, int64_t dim, Tensor& dx); }
namespace cuda { void max_backward(const Tensor& dy, const Tensor& indices, int64_t dim, Tensor& dx); }
inline void max_backward(const Tensor& dy, const Tensor& indices, int64_t dim, Tensor& dx) {
  AG_ON_BACKEND(dx.device(), max_backward, dy, indices, dim, dx);
}

// out (one float64 element, on out's device) = the sum over every tensor of xs of its squared
// elements, each square formed and added in double, chunk by chunk of a multi-tensor pass
// (framework/multi_tensor.h), the chunks' sums added in table order: the bits depend on the
// tensors' sizes alone, not on thread counts. xs: floating tensors of any dtypes, all on out's
// device. The squared L2 norm clip_grad_norm_ needs, read back with ONE host sync however many
// tensors: on CUDA every tensor goes through one launch, plus one to add the chunks' sums.
using SquaresChunks = std::vector<multi_tensor::Chunk<1>>;  ///< the chunk table of one tensor list
namespace cpu { void sum_of_squares(const SquaresChunks& chunks, Tensor& out); }
namespace cuda { void sum_of_squares(const SquaresChunks& chunks, Tensor& out); }
inline void sum_of_squares(const std::vector<Tensor>& xs, Tensor& out) {
  AG_CHECK(out.dtype() == DType::kFloat64 && out.numel() == 1, "sum_of_squares: out must be one float64 element, got ",
           out.to_string());
  for (const Tensor& x : xs) {
    AG_CHECK(is_compute(x.dtype()) && x.device() == out.device(), "sum_of_squares: cannot add the squares of ",
             x.to_string(), " into ", out.to_string(), "; hint: floating tensors on out's device only");
  }
  AG_ON_BACKEND(out.device(), sum_of_squares, multi_tensor::make_chunks<1>("sum_of_squares", {xs}, out.device()), out);
  out.bump_version();
}

// The second half of clip_grad_norm_ for p = 2, on the device and without a host wait (PyTorch's
// foreach path): sum_sq (one float64 element, sum_of_squares of xs) gives norm (one float64
// element, a different one) = sqrt(sum_sq). When norm is finite and coeff = max_norm / (norm + 1e-6)
// is below 1, every x of xs becomes coeff * x + 0 in place, coeff rounded to x's compute type:
// the bits affine(x, coeff, 0, x) gives. A non-finite norm or coeff >= 1 leaves xs as they are.
// On CUDA one multi-tensor launch covers every x; each block works the coefficient out itself.
namespace cpu { void clip_by_norm_(const SquaresChunks& chunks, const Tensor& sum_sq, double max_norm, Tensor& norm); }
namespace cuda { void clip_by_norm_(const SquaresChunks& chunks, const Tensor& sum_sq, double max_norm, Tensor& norm); }
inline void clip_by_norm_(std::vector<Tensor>& xs, const Tensor& sum_sq, double max_norm, Tensor& norm) {
  const auto one_double = [&](const Tensor& t) {
    return t.dtype() == DType::kFloat64 && t.numel() == 1 && t.device() == norm.device();
  };
  AG_CHECK(one_double(sum_sq) && one_double(norm),
           "clip_by_norm_: sum_sq and norm must be one float64 element each on one device, got ", sum_sq.to_string(),
           " and ", norm.to_string());
  AG_CHECK(sum_sq.data_ptr() != norm.data_ptr(), "clip_by_norm_: norm must not share sum_sq's storage");
  for (const Tensor& x : xs) {
    AG_CHECK(is_compute(x.dtype()) && x.device() == norm.device(), "clip_by_norm_: cannot scale ", x.to_string(),
             " by a norm in ", norm.to_string(), "; hint: floating tensors on norm's device only");
  }
  AG_ON_BACKEND(norm.device(), clip_by_norm_, multi_tensor::make_chunks<1>("clip_by_norm_", {xs}, norm.device()),
                sum_sq, max_norm, norm);
  norm.bump_version();
  for (Tensor& x : xs) x.bump_version();  // whether or not they were scaled: the host cannot know
}

}  // namespace ampgrad::kernels
