// Op-case rows for the ops of convolutional networks: conv2d (stride, padding, dilation, groups,
// depthwise, 1x1), the pools (ceil_mode, padding, count_include_pad, overlapping adaptive
// windows), batch norm (training and eval) and flatten.
#include "op_cases.h"
#include "ops/ops.h"

namespace ampgrad::test {

namespace {

// Fixed running statistics for the eval rows, on the device of the input they go with.
const Values kRunningMean{0.25, -0.5, 1.0}, kRunningVar{0.5, 2.0, 1.25};
Tensor channel_values(const Values& v, const Tensor& like) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::kFloat32, like.device());
}

}  // namespace

void append_conv_cases(std::vector<OpCase>& cases) {
  using In = const std::vector<Tensor>&;
  using Refs = const std::vector<Values>&;
  const auto add = [&](std::string name, std::vector<Shape> shapes, TensorFn fn,
                       std::function<Values(const std::vector<Values>&)> ref, Tol tol = {}) {
    cases.push_back({std::move(name), std::move(shapes), std::move(fn), std::move(ref), tol});
  };

  // conv2d: {shapes, options, window} per row; the tolerance counts C/groups kH kW terms.
  struct ConvRow {
    const char* name;
    Shape x, w;
    bool bias;
    ops::Conv2dOptions options;
  };
  const ConvRow conv_rows[] = {
      {"conv2d", {2, 3, 7, 6}, {4, 3, 3, 3}, true, {.padding = {1, 1}}},
      {"conv2d_strided_dilated", {2, 2, 9, 8}, {3, 2, 3, 2}, true,
       {.stride = {2, 1}, .padding = {1, 0}, .dilation = {2, 1}}},
      {"conv2d_groups", {1, 4, 5, 5}, {6, 2, 3, 3}, false, {.stride = {1, 2}, .groups = 2}},
      {"conv2d_depthwise", {2, 3, 6, 6}, {3, 1, 3, 3}, true, {.stride = {2, 2}, .padding = {1, 1}, .groups = 3}},
      {"conv2d_depthwise_stride1", {2, 4, 5, 7}, {4, 1, 3, 2}, false, {.padding = {1, 0}, .dilation = {1, 2}, .groups = 4}},
      // Stride 1, undilated, padding below the kernel: the padded-grid kernels (an input smaller
      // than the kernel, padding on one side only, a kernel wider than tall).
      {"conv2d_depthwise_grid", {2, 3, 6, 7}, {3, 1, 3, 3}, true, {.padding = {1, 1}, .groups = 3}},
      {"conv2d_depthwise_grid_small_input", {1, 2, 3, 4}, {2, 1, 5, 5}, false, {.padding = {2, 2}, .groups = 2}},
      {"conv2d_depthwise_grid_odd", {2, 2, 5, 4}, {2, 1, 2, 3}, true, {.padding = {0, 2}, .groups = 2}},
      // A grid of 17 x 32 = 544 positions: several 32-output blocks, the weight gradient's sums in
      // two blocks of 512.
      {"conv2d_depthwise_grid_long", {1, 2, 17, 30}, {2, 1, 3, 3}, true, {.padding = {1, 1}, .groups = 2}},
      {"conv2d_depthwise_multiplier", {1, 2, 5, 5}, {4, 1, 3, 3}, true, {.padding = {1, 1}, .groups = 2}},
      {"conv2d_1x1", {2, 5, 4, 3}, {7, 5, 1, 1}, true, {}},
      {"conv2d_odd", {3, 2, 5, 7}, {2, 2, 2, 4}, true, {.stride = {3, 2}, .padding = {0, 2}, .dilation = {1, 2}}},
  };
  for (const ConvRow& r : conv_rows) {
    std::vector<Shape> shapes{r.x, r.w};
    if (r.bias) shapes.push_back({r.w[0]});
    const WindowRef g{.kh = r.w[2], .kw = r.w[3], .sh = r.options.stride[0], .sw = r.options.stride[1],
                      .ph = r.options.padding[0], .pw = r.options.padding[1], .dh = r.options.dilation[0],
                      .dw = r.options.dilation[1]};
    add(r.name, shapes,
        [o = r.options](In t) { return ops::conv2d(t[0], t[1], t.size() > 2 ? t[2] : Tensor(), o); },
        [r, g](Refs v) { return conv2d_ref(v[0], r.x, v[1], r.w, v.size() > 2 ? v[2] : Values{}, g, r.options.groups); },
        {.k = r.w[1] * r.w[2] * r.w[3] + 1, .magnitude = 4});
  }
  add("conv2d_unbatched", {{3, 5, 5}, {2, 3, 3, 3}}, [](In t) { return ops::conv2d(t[0], t[1]); },
      [](Refs v) { return conv2d_ref(v[0], {1, 3, 5, 5}, v[1], {2, 3, 3, 3}, {}, {.kh = 3, .kw = 3}, 1); },
      {.k = 27, .magnitude = 4});

  // Pools. ceil_mode with padding gives a last window that hangs over the padded input.
  add("max_pool2d", {{2, 3, 6, 7}}, [](In t) { return ops::max_pool2d(t[0], {.kernel_size = {2, 2}}); },
      [](Refs v) { return max_pool2d_ref(v[0], {2, 3, 6, 7}, {.kh = 2, .kw = 2, .sh = 2, .sw = 2}, 3, 3); });
  add("max_pool2d_padded_ceil", {{1, 2, 7, 6}},
      [](In t) {
        return ops::max_pool2d(t[0], {.kernel_size = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true});
      },
      [](Refs v) { return max_pool2d_ref(v[0], {1, 2, 7, 6}, {.kh = 3, .kw = 3, .sh = 2, .sw = 2, .ph = 1, .pw = 1}, 4, 4); });
  add("max_pool2d_dilated", {{2, 6, 7}},
      [](In t) { return ops::max_pool2d(t[0], {.kernel_size = {2, 3}, .stride = {1, 2}, .dilation = {2, 1}}); },
      [](Refs v) { return max_pool2d_ref(v[0], {2, 6, 7}, {.kh = 2, .kw = 3, .sh = 1, .sw = 2, .dh = 2}, 4, 3); });
  // ceil_mode's last window would start in the right padding: PyTorch drops it (5 -> 3, not 4).
  add("max_pool2d_ceil_drops_last", {{1, 2, 5, 5}},
      [](In t) {
        return ops::max_pool2d(t[0], {.kernel_size = {2, 2}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true});
      },
      [](Refs v) { return max_pool2d_ref(v[0], {1, 2, 5, 5}, {.kh = 2, .kw = 2, .sh = 2, .sw = 2, .ph = 1, .pw = 1}, 3, 3); });
  add("max_pool2d_dilated_padded", {{1, 2, 7, 7}},
      [](In t) { return ops::max_pool2d(t[0], {.kernel_size = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .dilation = {2, 2}}); },
      [](Refs v) {
        return max_pool2d_ref(v[0], {1, 2, 7, 7}, {.kh = 3, .kw = 3, .sh = 2, .sw = 2, .ph = 1, .pw = 1, .dh = 2, .dw = 2}, 3, 3);
      });
  add("avg_pool2d_ceil_drops_last", {{1, 2, 5, 5}},
      [](In t) {
        return ops::avg_pool2d(t[0], {.kernel_size = {2, 2}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true});
      },
      [](Refs v) {
        return avg_pool2d_ref(v[0], {1, 2, 5, 5}, {.kh = 2, .kw = 2, .sh = 2, .sw = 2, .ph = 1, .pw = 1}, 3, 3, true);
      },
      {.k = 4, .magnitude = 2});
  add("avg_pool2d_divisor_override", {{2, 5, 6}},
      [](In t) { return ops::avg_pool2d(t[0], {.kernel_size = {2, 3}, .stride = {1, 2}, .divisor_override = 5}); },
      [](Refs v) {
        Values out = avg_pool2d_ref(v[0], {2, 5, 6}, {.kh = 2, .kw = 3, .sh = 1, .sw = 2}, 4, 2, true);
        for (double& o : out) o = o * 6 / 5;  // the window's sum over 5, not its 6 taps
        return out;
      },
      {.k = 6, .magnitude = 2});
  add("avg_pool2d", {{2, 3, 6, 4}}, [](In t) { return ops::avg_pool2d(t[0], {.kernel_size = {2, 2}}); },
      [](Refs v) { return avg_pool2d_ref(v[0], {2, 3, 6, 4}, {.kh = 2, .kw = 2, .sh = 2, .sw = 2}, 3, 2, true); },
      {.k = 4, .magnitude = 2});
  add("avg_pool2d_padded_ceil", {{1, 2, 7, 6}},
      [](In t) {
        return ops::avg_pool2d(t[0], {.kernel_size = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true});
      },
      [](Refs v) {
        return avg_pool2d_ref(v[0], {1, 2, 7, 6}, {.kh = 3, .kw = 3, .sh = 2, .sw = 2, .ph = 1, .pw = 1}, 4, 4, true);
      },
      {.k = 9, .magnitude = 2});
  add("avg_pool2d_exclude_pad", {{1, 2, 7, 6}},
      [](In t) {
        return ops::avg_pool2d(t[0], {.kernel_size = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true,
                                      .count_include_pad = false});
      },
      [](Refs v) {
        return avg_pool2d_ref(v[0], {1, 2, 7, 6}, {.kh = 3, .kw = 3, .sh = 2, .sw = 2, .ph = 1, .pw = 1}, 4, 4, false);
      },
      {.k = 9, .magnitude = 2});
  add("adaptive_avg_pool2d", {{2, 3, 7, 5}}, [](In t) { return ops::adaptive_avg_pool2d(t[0], {3, 2}); },
      [](Refs v) { return adaptive_avg_pool2d_ref(v[0], {2, 3, 7, 5}, 3, 2); }, {.k = 9, .magnitude = 2});
  add("adaptive_avg_pool2d_global", {{2, 3, 4, 5}}, [](In t) { return ops::adaptive_avg_pool2d(t[0], {1, 1}); },
      [](Refs v) { return adaptive_avg_pool2d_ref(v[0], {2, 3, 4, 5}, 1, 1); }, {.k = 20, .magnitude = 2});

  // Batch norm: training (batch statistics; the running ones it updates are made inside, so each
  // call starts from the same) and eval (fixed running statistics).
  add("batch_norm_train", {{4, 3, 5}, {3}, {3}},
      [](In t) {
        const Tensor mean = zeros({3}, DType::kFloat32, t[0].device()), var = ones({3}, DType::kFloat32, t[0].device());
        return ops::batch_norm(t[0], mean, var, t[1], t[2], /*training=*/true);
      },
      [](Refs v) { return batch_norm_ref(v[0], {4, 3, 5}, {}, {}, v[1], v[2], 1e-5); }, {.k = 20, .magnitude = 8});
  add("batch_norm_train_plain", {{6, 3}},
      [](In t) { return ops::batch_norm(t[0], Tensor(), Tensor(), Tensor(), Tensor(), /*training=*/true); },
      [](Refs v) { return batch_norm_ref(v[0], {6, 3}, {}, {}, {}, {}, 1e-5); }, {.k = 6, .magnitude = 4});
  add("batch_norm_eval", {{3, 3, 2, 2}, {3}, {3}},
      [](In t) {
        return ops::batch_norm(t[0], channel_values(kRunningMean, t[0]), channel_values(kRunningVar, t[0]), t[1], t[2],
                               /*training=*/false);
      },
      [](Refs v) { return batch_norm_ref(v[0], {3, 3, 2, 2}, kRunningMean, kRunningVar, v[1], v[2], 1e-5); },
      {.k = 2, .magnitude = 8});

  add("flatten", {{2, 3, 4}}, [](In t) { return ops::flatten(t[0], 1); }, [](Refs v) { return v[0]; });
}

}  // namespace ampgrad::test
