// Convolution kernels: the im2col / col2im moves around the GEMMs of conv2d, and the transposes
// between the GEMM's channel-major layout and the tensor's sample-major one. Columns are laid out
// channel-major, cols [K, n, L] with K = C kH kW (rows ordered c, kh, kw) and L = Ho Wo, so that
// one GEMM per group spans the whole chunk of n samples (FP32 sums over n L, one rounding) and a
// group's rows are one contiguous block. Callers have checked shapes, dtypes and devices; outputs
// are preallocated and overwritten.
#pragma once

#include <algorithm>

#include "framework/device.h"
#include "framework/tensor.h"

namespace ampgrad::kernels {

/// A convolution's (or pooling window's) geometry over an [H, W] input: taps kh x kw, stride,
/// zero padding and dilation per side, and the output size Ho x Wo they give.
struct ConvGeometry {
  int64_t kh = 1, kw = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t out_h = 1, out_w = 1;
};

/// The output positions o in [lo, hi) of [0, out) whose tap o stride - pad + offset lies inside
/// [0, size): the loops of im2col, col2im and the pools run over these without a test per tap.
struct ValidRange {
  int64_t lo, hi;
};
inline ValidRange valid_range(int64_t out, int64_t stride, int64_t pad, int64_t offset, int64_t size) {
  // o stride + (offset - pad) in [0, size) <=> o in [ceil((pad - offset) / stride), ceil((size + pad - offset) / stride))
  const auto ceil_div = [](int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); };
  const int64_t lo = std::clamp<int64_t>(ceil_div(pad - offset, stride), 0, out);
  const int64_t hi = std::clamp<int64_t>(ceil_div(size + pad - offset, stride), lo, out);
  return {lo, hi};
}

/// How many column values conv2d's im2col route builds per chunk of samples at most: it bounds
/// im2col's memory whatever the batch, while a chunk's GEMMs stay large enough to run at the
/// engine's speed. The CPU's GEMM is at its speed well within 2^23 (32 MB of float32). A GPU needs
/// GEMMs that fill all its multiprocessors, and pays each chunk's launches and cuBLAS calls once:
/// 2^26 (128 MB of 16-bit values, 256 MB of float32, 512 MB of float64) takes a ResNet stage's 32
/// samples of 64 channels at 56 x 56 with a 3 x 3 kernel in one chunk.
int64_t im2col_column_budget(Device device);
/// For tests, process-wide: im2col_column_budget gives `values` on every device (0 restores the
/// defaults), so that conv2d's chunk loop runs on small tensors, on the GPU too.
void set_im2col_column_budget_for_testing(int64_t values);

// cols[(c, i, j), s, (oh, ow)] = x[n0 + s, c, oh sh - ph + i dh, ow sw - pw + j dw] (0 where that
// falls in the padding) for the cols.size(1) samples from n0. x is [N, C, H, W]; cols is
// [C kh kw, n, Ho Wo]; any dtype (a move: the FP8 conv2d's columns are 8-bit).
namespace cpu {
void im2col(const Tensor& x, int64_t n0, const ConvGeometry& g, Tensor& cols);
}
namespace cuda {
void im2col(const Tensor& x, int64_t n0, const ConvGeometry& g, Tensor& cols);
}
inline void im2col(const Tensor& x, int64_t n0, const ConvGeometry& g, Tensor& cols) {
  AG_ON_BACKEND(cols.device(), im2col, x, n0, g, cols);
}

// The adjoint of im2col: dx[n0 + s, c, y, x] = the sum of every cols entry im2col would have read
// from there (summed in the compute type, rounded once), for the cols.size(1) samples from n0;
// dx's other samples are left alone. cols is [C kh kw, n, Ho Wo]; dx is [N, C, H, W].
namespace cpu {
void col2im(const Tensor& cols, const ConvGeometry& g, int64_t n0, Tensor& dx);
}
namespace cuda {
void col2im(const Tensor& cols, const ConvGeometry& g, int64_t n0, Tensor& dx);
}
inline void col2im(const Tensor& cols, const ConvGeometry& g, int64_t n0, Tensor& dx) {
  AG_ON_BACKEND(dx.device(), col2im, cols, g, n0, dx);
}

// out[n0 + s, o, l] = ct[o, s, l] + b[o] (b may be undefined: 0), for the ct.size(1) samples from
// n0, added in the compute type. ct is [O, n, L]; out is [N, O, L] (any shape with that numel).
namespace cpu {
void samples_from_channels(const Tensor& ct, const Tensor& b, int64_t n0, Tensor& out);
}
namespace cuda {
void samples_from_channels(const Tensor& ct, const Tensor& b, int64_t n0, Tensor& out);
}
inline void samples_from_channels(const Tensor& ct, const Tensor& b, int64_t n0, Tensor& out) {
  AG_ON_BACKEND(out.device(), samples_from_channels, ct, b, n0, out);
}

// ct[o, s, l] = y[n0 + s, o, l]: the ct.size(1) samples from n0 of y [N, O, L] (any shape with
// that numel), channel-major. ct is [O, n, L]; any dtype (a move).
namespace cpu {
void channels_from_samples(const Tensor& y, int64_t n0, Tensor& ct);
}
namespace cuda {
void channels_from_samples(const Tensor& y, int64_t n0, Tensor& ct);
}
inline void channels_from_samples(const Tensor& y, int64_t n0, Tensor& ct) {
  AG_ON_BACKEND(ct.device(), channels_from_samples, y, n0, ct);
}

// The direct stride-1 convolution (CPU; float32, and bfloat16 where AVX512_BF16 is allowed):
// y [N, O, Ho, Wo] = conv(x, w) + b computed in register tiles straight from a zero-padded copy of
// x, without columns or transposes; float32 gives the im2col GEMM route's bits (each output is 0,
// one FMA per (c, i, j) in order, then + b), bfloat16 sums channel pairs and rounds once. It
// applies to ungrouped, undilated stride-1 convolutions with a kernel larger than 1 x 1 and padding
// below the kernel's size (so that the input gradient is one too); b may be undefined.
// direct_conv2d_input_grad: dx [N, C, H, W] from dy [N, O, Ho, Wo], as the stride-1 convolution of
// dy padded by kernel - 1 - padding with w transposed and turned (summed over (o, i, j)).
// direct_conv2d_weight_grad: dw [O, C, kh, kw] = the sum over samples and outputs of dy x at each
// tap, in float vector lanes over every sample, the lanes added in double. It returns false when
// any sum is NaN, whatever the cause, and the caller then takes the im2col route for dw: a
// non-finite x can make a NaN where that route gives a finite value or an infinity (the dropped
// grid columns and the positions past the grid pair other x values, the next row's, channel's or
// sample's, with a dy of 0). All three overwrite their output; dy, w, x and the outputs share one
// dtype.
// On small planes (float32 at AVX-512, bfloat16 at AVX512_BF16) each of the three (each decided by
// its own shape) runs along output channels instead of grid positions: the forward and dx give the
// same bits; dw's float sums take fewer terms each (about 2048 plus a group of samples' positions)
// and cover no dropped column, so there a NaN is the reference's (in float32; bfloat16 pairs the
// last position of an odd row with the value after it in x, times a dy of 0: where rows share
// padding columns that can be the next row's first value, and an infinity there makes a NaN the
// reference lacks, so dw takes the im2col route).
// set_direct_conv_budgets_for_testing: lowers the grid route's transients' budgets (padded values
// per chunk of samples, partial-sum floats per band of channels; 0 restores the default) so that
// tests run the chunk and band loops more than once.
// set_direct_conv_route_for_testing: forces the grid or the channel tiles (kAuto: by shape) so that
// tests hold both to the same results; the channel tiles need AVX-512 and fall back to the grid.
namespace cpu {
bool direct_conv2d_applies(const Tensor& x, const Tensor& w, const ConvGeometry& g, int64_t groups);
void direct_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeometry& g, Tensor& y);
void direct_conv2d_input_grad(const Tensor& dy, const Tensor& w, const ConvGeometry& g, Tensor& dx);
[[nodiscard]] bool direct_conv2d_weight_grad(const Tensor& x, const Tensor& dy, const ConvGeometry& g, Tensor& dw);
void set_direct_conv_budgets_for_testing(int64_t padded_values, int64_t partial_floats);
enum class DirectConvRoute { kAuto, kGrid, kChannels };
void set_direct_conv_route_for_testing(DirectConvRoute route);
}  // namespace cpu
inline bool direct_conv2d_applies(const Tensor& x, const Tensor& w, const ConvGeometry& g, int64_t groups) {
  return x.device() == Device::kCPU && cpu::direct_conv2d_applies(x, w, g, groups);
}

// Depthwise convolution (groups = C = O: one kh x kw filter per channel), directly, without
// columns: y[n, c, oh, ow] = b[c] + sum over taps inside x of x[n, c, tap] w[c, 0, i, j], summed in
// the compute type and rounded once (b may be undefined: 0). x is [N, C, H, W], w [C, 1, kh, kw],
// y [N, C, Ho, Wo].
namespace cpu {
void depthwise_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeometry& g, Tensor& y);
}
namespace cuda {
void depthwise_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeometry& g, Tensor& y);
}
inline void depthwise_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeometry& g, Tensor& y) {
  AG_ON_BACKEND(y.device(), depthwise_conv2d, x, w, b, g, y);
}

// Its gradients from dy [N, C, Ho, Wo]: dx (x's shape) = each pixel's sum of dy w over the windows
// that read it; dw (w's shape) = sum over n and the outputs of dy x at each tap, in double. Either
// may be undefined when not needed; both are overwritten (dw on the CPU: float sums of each
// sample's products over short runs, per output column or, at stride 1, over blocks of 512
// positions in vector lanes, added in double; on CUDA every product in double).
// On the CPU a depthwise convolution at stride 1, undilated, with padding below the kernel runs
// over a zero-padded copy of each plane, on the padded-width grid (conv_cpu.cc). An infinite x or
// weight can give NaN there where the others, row by row, give an infinity: in y and dx it
// stands; a weight gradient with a NaN is computed again row by row.
namespace cpu {
void depthwise_conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const ConvGeometry& g, Tensor& dx,
                               Tensor& dw);
}
namespace cuda {
void depthwise_conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const ConvGeometry& g, Tensor& dx,
                               Tensor& dw);
}
inline void depthwise_conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const ConvGeometry& g,
                                      Tensor& dx, Tensor& dw) {
  AG_ON_BACKEND(dy.device(), depthwise_conv2d_backward, x, w, dy, g, dx, dw);
}

}  // namespace ampgrad::kernels
