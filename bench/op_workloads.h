// Single-op workloads for step_timer (mirrored in pytorch_workloads.py), each with the bytes it
// moves or the FLOP it does, so step_timer can print GB/s or GFLOP/s beside the time:
//   add_bias_{fp32,fp16}      x [64,512,768] + b [768]           (reads x, writes the sum)
//   add_residual_{fp32,fp16}  x [64,512,768] + r [64,512,768]    (reads both, writes the sum)
//   bmm_{fp32,fp16}           a [8,12,256,64] @ b [8,12,64,256]  (attention's scores)
//   matmul_long_k_fp32        a [512, 50304] @ b [50304, 768]    (GPT-2 small's classifier's input
//                             gradient at T = 256, batch 2: a k far longer than n)
//   sdpa{256,1024}_{fused,composed}[_dropout]_{fp32,bf16}
//                             causal attention forward + backward, q, k, v [2,12,T,64] (GPT-2
//                             small's heads at batch 2), through each AttentionBackend, with
//                             dropout_p 0.1 on the probabilities for _dropout; the FLOP are the
//                             usual 3.5 x the forward's 4 T^2 D per head, halved (causal)
//   heads_{split,packed}_{fp32,bf16}
//                             GPT-2 small's attention at T = 256, batch 2 from the fused qkv
//                             projection [2, 256, 2304] to the merged [2, 256, 768], forward +
//                             backward: split into heads, fused attention and merge (copies each
//                             way), or self_attention reading the heads in place; same FLOP
//   gelu_{fp32,bf16}          tanh GELU over [2048, 1536] (the 6-layer GPT's MLP activations)
//   layer_norm_{fp32,bf16}    layer norm with weight and bias over [2048, 384] (its residual stream);
//                             both forward + backward of the sum; bytes: x read twice, dy read, y
//                             and dx written
//   adamw_fp32                AdamW's step over 16M float32 parameters in 8 tensors with their
//                             gradients (reads w, g, m, v and writes w, m, v: 28 bytes a parameter)
//   conv_{cnn,resnet}_{fp32,bf16}
//                             conv2d forward + backward (dx and dw), 3x3, padding 1: the Fashion CNN's
//                             second layer (x [128, 32, 14, 14] -> 64 channels) and a ResNet stage
//                             (x [32, 64, 56, 56] -> 64 channels); FLOP = 3 x the forward's 2 N O L C 9
//   conv_{depthwise,1x1}_{fp32,bf16}
//                             the ResNet stage's x as a depthwise 3x3 (groups 64) and a 1x1 convolution
//   copy_bandwidth            a 96 MiB float copy on the pool: the machine's copy bandwidth
#pragma once

#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "ampgrad.h"

namespace ampgrad::bench {

struct OpWorkload {
  std::function<void()> run;
  double bytes = 0;  // moved per run (read + written), for GB/s; 0 when flop is the figure
  double flop = 0;   // per run, for GFLOP/s
};

/// The workload called `name`, or nullptr if there is none.
inline std::unique_ptr<OpWorkload> make_op_workload(const std::string& name) {
  const DType dtype = name.ends_with("_fp16") ? DType::kFloat16 : DType::kFloat32;
  const double elem = static_cast<double>(element_size(dtype));
  manual_seed(0);
  if (name.starts_with("add_bias_") || name.starts_with("add_residual_")) {
    const bool bias = name.starts_with("add_bias_");
    const Tensor x = randn({64, 512, 768}, dtype);
    const Tensor y = bias ? randn({768}, dtype) : randn({64, 512, 768}, dtype);
    const double n = static_cast<double>(x.numel());
    return std::make_unique<OpWorkload>(OpWorkload{[x, y] { Tensor z = x + y; }, (bias ? 2 : 3) * n * elem, 0});
  }
  if (name.starts_with("bmm_")) {
    const Tensor a = randn({8, 12, 256, 64}, dtype), b = randn({8, 12, 64, 256}, dtype);
    return std::make_unique<OpWorkload>(OpWorkload{[a, b] { ops::matmul(a, b); }, 0, 2.0 * 96 * 256 * 256 * 64});
  }
  if (name == "matmul_long_k_fp32") {
    const Tensor a = randn({512, 50304}), b = randn({50304, 768});
    return std::make_unique<OpWorkload>(OpWorkload{[a, b] { ops::matmul(a, b); }, 0, 2.0 * 512 * 50304 * 768});
  }
  if (name.starts_with("sdpa")) {
    const int64_t t = name.starts_with("sdpa1024_") ? 1024 : 256;
    const auto backend = name.find("_fused_") != std::string::npos ? ops::AttentionBackend::kFused
                                                                    : ops::AttentionBackend::kComposed;
    std::vector<Tensor> qkv;
    for (int i = 0; i < 3; ++i) {
      qkv.push_back(randn({2, 12, t, 64}, name.ends_with("_bf16") ? DType::kBFloat16 : DType::kFloat32));
      qkv.back().set_requires_grad(true);
    }
    const ops::AttentionOptions options{.dropout_p = name.find("_dropout_") != std::string::npos ? 0.1 : 0.0,
                                        .is_causal = true};
    const double flop = 3.5 * 4.0 * 24 * static_cast<double>(t * t) * 64 / 2;
    return std::make_unique<OpWorkload>(OpWorkload{[qkv, backend, options] {
                                                     ops::AttentionBackendGuard guard(backend);
                                                     ops::sum(ops::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2],
                                                                                                options))
                                                         .backward();
                                                     for (Tensor x : qkv) x.set_grad(Tensor());
                                                   },
                                                   0, flop});
  }
  if (name.starts_with("heads_")) {
    const bool packed = name.starts_with("heads_packed_");
    Tensor qkv = randn({2, 256, 3 * 768}, name.ends_with("_bf16") ? DType::kBFloat16 : DType::kFloat32);
    qkv.set_requires_grad(true);
    const double flop = 3.5 * 4.0 * 24 * 256.0 * 256 * 64 / 2;
    return std::make_unique<OpWorkload>(OpWorkload{[qkv, packed] {
                                                     Tensor y;
                                                     if (packed) {
                                                       y = ops::self_attention(qkv, 12, true);
                                                     } else {
                                                       const std::vector<Tensor> parts = ops::split(qkv, 768, -1);
                                                       const auto heads = [](const Tensor& x) {
                                                         return ops::transpose(ops::reshape(x, {2, 256, 12, 64}), 1, 2);
                                                       };
                                                       y = ops::scaled_dot_product_attention(
                                                           heads(parts[0]), heads(parts[1]), heads(parts[2]), true);
                                                       y = ops::reshape(ops::transpose(y, 1, 2), {2, 256, 768});
                                                     }
                                                     ops::sum(y).backward();
                                                     Tensor(qkv).set_grad(Tensor());
                                                   },
                                                   0, flop});
  }
  if (name.starts_with("conv_")) {
    // conv_{cnn,resnet}: 3x3 into 64 channels; conv_depthwise: the ResNet stage's shape, 3x3 per
    // channel (groups 64); conv_1x1: the ResNet stage's shape, 1x1 into 64 channels.
    const bool cnn = name.starts_with("conv_cnn_"), depthwise = name.starts_with("conv_depthwise_");
    const bool pointwise = name.starts_with("conv_1x1_");
    const DType conv_dtype = name.ends_with("_bf16") ? DType::kBFloat16 : DType::kFloat32;
    const Shape xs = cnn ? Shape{128, 32, 14, 14} : Shape{32, 64, 56, 56};
    const int64_t out = 64, k = pointwise ? 1 : 3, groups = depthwise ? xs[1] : 1;
    Tensor x = randn(xs, conv_dtype), w = randn({out, xs[1] / groups, k, k}, conv_dtype);
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    const double flop = 3.0 * 2 * static_cast<double>(xs[0] * out * xs[2] * xs[3] * (xs[1] / groups) * k * k);
    const ops::Conv2dOptions options{.padding = {k / 2, k / 2}, .groups = groups};
    return std::make_unique<OpWorkload>(OpWorkload{[x, w, options] {
                                                     ops::sum(ops::conv2d(x, w, Tensor(), options)).backward();
                                                     Tensor(x).set_grad(Tensor());
                                                     Tensor(w).set_grad(Tensor());
                                                   },
                                                   0, flop});
  }
  if (name.starts_with("gelu_") || name.starts_with("layer_norm_")) {
    const bool gelu = name.starts_with("gelu_");
    const DType op_dtype = name.ends_with("_bf16") ? DType::kBFloat16 : DType::kFloat32;
    Tensor x = randn(gelu ? Shape{2048, 1536} : Shape{2048, 384}, op_dtype);
    x.set_requires_grad(true);
    const Tensor w = randn({384}, op_dtype), b = randn({384}, op_dtype);
    const double bytes = 5.0 * static_cast<double>(x.numel() * element_size(op_dtype));
    return std::make_unique<OpWorkload>(OpWorkload{[x, w, b, gelu] {
                                                     const Tensor y = gelu ? ops::gelu(x, ops::GeluApproximation::kTanh)
                                                                           : ops::layer_norm(x, w, b);
                                                     ops::sum(y).backward();
                                                     Tensor(x).set_grad(Tensor());
                                                   },
                                                   bytes, 0});
  }
  if (name == "adamw_fp32") {
    std::vector<Tensor> params;
    for (int i = 0; i < 8; ++i) {
      params.push_back(randn({2048, 1024}));
      params.back().set_requires_grad(true);
      params.back().set_grad(randn({2048, 1024}));
    }
    auto opt = std::make_shared<optim::AdamW>(params, optim::AdamWOptions{.lr = 1e-4, .weight_decay = 0.1});
    return std::make_unique<OpWorkload>(OpWorkload{[opt] { opt->step(); }, 28.0 * 8 * 2048 * 1024, 0});
  }
  if (name == "copy_bandwidth") {
    // The same size as the add workloads' float operands, first touched here so no page faults
    // are timed; copied in pieces on the pool, as the element-wise ops run.
    const int64_t n = int64_t{64} * 512 * 768;
    auto src = std::make_shared<std::vector<float>>(n, 1.0f), dst = std::make_shared<std::vector<float>>(n, 0.0f);
    return std::make_unique<OpWorkload>(OpWorkload{[src, dst, n] {
                                                     parallel_range(n, kElementwiseGrain, [&](int64_t lo, int64_t hi) {
                                                       std::memcpy(dst->data() + lo, src->data() + lo,
                                                                   static_cast<size_t>(hi - lo) * sizeof(float));
                                                     });
                                                   },
                                                   2.0 * static_cast<double>(n) * sizeof(float), 0});
  }
  return nullptr;
}

}  // namespace ampgrad::bench
