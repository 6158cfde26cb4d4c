// Normalisation kernels: layer norm over the last dimension (x viewed as [rows, C]) and batch norm
// over dimension 1. Statistics are computed in float or double (float64 for float64 data) with a
// two-pass variance. Callers have checked shapes, dtypes and devices; outputs are preallocated
// and overwritten.
#pragma once

#include <type_traits>

#include "framework/device.h"
#include "framework/tensor.h"

namespace ampgrad::kernels {

// The type statistics (mean, rstd, var) are kept in for compute type C: double for float64, else float.
template <typename C> using Stat = std::conditional_t<std::is_same_v<C, double>, double, float>;

// y = (x - mean) * rstd * w + b per row (w and b [C] may be undefined: 1 and 0); mean and rstd
// ([rows], float32, or float64 for float64 x) are written for the backward. rstd = 1/sqrt(var + eps)
// with the biased variance, as PyTorch.
namespace cpu {
void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y, Tensor& mean, Tensor& rstd);
}
namespace cuda {
void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y, Tensor& mean, Tensor& rstd);
}
inline void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y, Tensor& mean,
                       Tensor& rstd) {
  AG_ON_BACKEND(y.device(), layer_norm, x, w, b, eps, y, mean, rstd);
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)) with g = dy w and xhat = (x - mean) rstd; and
// dy_xhat = dy * xhat (x's shape; summed over rows it is dw, and dy summed is db). dx and dy_xhat
// may be undefined when not needed.
namespace cpu {
void layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                         Tensor& dx, Tensor& dy_xhat);
}
namespace cuda {
void layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                         Tensor& dx, Tensor& dy_xhat);
}
inline void layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                                const Tensor& dy, Tensor& dx, Tensor& dy_xhat) {
  AG_ON_BACKEND(dy.device(), layer_norm_backward, x, w, mean, rstd, dy, dx, dy_xhat);
}

// Batch norm over dimension 1: x is viewed as [N, C, S] (S the product of the dimensions after C).
// Per-channel statistics (mean, var, rstd: [C]) are float32, or float64 for float64 x.

// mean[c] and the biased var[c] of x[:, c, :], accumulated in double (two passes).
namespace cpu {
void batch_norm_stats(const Tensor& x, Tensor& mean, Tensor& var);
}
namespace cuda {
void batch_norm_stats(const Tensor& x, Tensor& mean, Tensor& var);
}
inline void batch_norm_stats(const Tensor& x, Tensor& mean, Tensor& var) {
  AG_ON_BACKEND(x.device(), batch_norm_stats, x, mean, var);
}

/// What batch_norm_finalize folds into the running statistics (PyTorch's momentum update).
struct RunningUpdate {
  double momentum = 0.1;  // running = (1 - momentum) running + momentum batch
  double unbias = 1.0;    // the batch variance's factor n / (n - 1)
};

// rstd[c] = 1 / sqrt(var[c] + eps); and, for each running tensor that is defined (any floating
// dtype, [C]), running_mean = (1 - m) running_mean + m mean, running_var = (1 - m) running_var +
// m unbias var, computed in double and rounded once.
namespace cpu {
void batch_norm_finalize(const Tensor& mean, const Tensor& var, double eps, RunningUpdate update,
                         Tensor& running_mean, Tensor& running_var, Tensor& rstd);
}
namespace cuda {
void batch_norm_finalize(const Tensor& mean, const Tensor& var, double eps, RunningUpdate update,
                         Tensor& running_mean, Tensor& running_var, Tensor& rstd);
}
inline void batch_norm_finalize(const Tensor& mean, const Tensor& var, double eps, RunningUpdate update,
                                Tensor& running_mean, Tensor& running_var, Tensor& rstd) {
  AG_ON_BACKEND(rstd.device(), batch_norm_finalize, mean, var, eps, update, running_mean, running_var, rstd);
}

// y = (x - mean[c]) rstd[c] w[c] + b[c] (w and b [C], x's dtype, may be undefined: 1 and 0).
namespace cpu {
void batch_norm_apply(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w, const Tensor& b,
                      Tensor& y);
}
namespace cuda {
void batch_norm_apply(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w, const Tensor& b,
                      Tensor& y);
}
inline void batch_norm_apply(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                             const Tensor& b, Tensor& y) {
  AG_ON_BACKEND(y.device(), batch_norm_apply, x, mean, rstd, w, b, y);
}

/// Where batch_norm's statistics came from: this batch (so they depend on x) or the running ones.
enum class BatchStatistics : bool { kBatch, kRunning };

// With xhat = (x - mean) rstd, g = dy w and per-channel sums over N and S in double:
//   dw = sum(dy xhat), db = sum(dy);
//   dx = rstd (g - mean(g) - xhat mean(g xhat)) for kBatch, rstd g for kRunning.
// dx, dw and db may be undefined when not needed; dw and db are [C] in w's (x's) dtype.
namespace cpu {
void batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                         BatchStatistics stats, Tensor& dx, Tensor& dw, Tensor& db);
}
namespace cuda {
void batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                         BatchStatistics stats, Tensor& dx, Tensor& dw, Tensor& db);
}
inline void batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& rstd,
                                const Tensor& w, BatchStatistics stats, Tensor& dx, Tensor& dw, Tensor& db) {
  AG_ON_BACKEND(dy.device(), batch_norm_backward, x, dy, mean, rstd, w, stats, dx, dw, db);
}

}  // namespace ampgrad::kernels
