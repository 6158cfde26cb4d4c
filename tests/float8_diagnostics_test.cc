// FP8 diagnostics: what each FP8 linear's casts saw in a step (amax, scale, saturated and flushed
// counts), counted exactly against values chosen on each side of the formats' limits; the step
// rules; the skip report naming the FP8 cast an inf passed through; TensorBoard scalars; the
// amax-history chart.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ampgrad.h"
#include "test_util.h"
#include "utils/event_reader.h"

namespace ag = ampgrad;
using ag::DType;
using ag::Tensor;
using ag::amp::Float8Guard;
using ag::amp::Float8Role;
using ag::amp::Float8Scaling;
using ag::amp::Float8TensorStats;

namespace {

Tensor leaf(Tensor t) {
  t.set_requires_grad(true);
  return t;
}

Tensor random_tensor(const ag::Shape& shape, double lo, double hi, uint64_t seed) {
  std::vector<float> values;
  for (double v : ag::test::random_values(static_cast<size_t>(ag::shape_numel(shape)), lo, hi, seed)) {
    values.push_back(static_cast<float>(v));
  }
  return Tensor::from_vector(values, shape);
}

const Float8TensorStats& find(const std::vector<Float8TensorStats>& stats, const std::string& name, Float8Role role) {
  for (const Float8TensorStats& s : stats) {
    if (s.name == name && s.role == role) return s;
  }
  static const Float8TensorStats none;
  ADD_FAILURE() << "no FP8 stats for " << name << " " << ag::amp::role_name(role);
  return none;
}

}  // namespace

TEST(Float8Diagnostics, CountsWhatSaturatedAndWhatFlushedInEachTensor) {
  // Without scaling, E4M3 rounds magnitudes up to 464 to at most 448 and flushes those at or below
  // 2^-10 (half its smallest subnormal, 2^-9; the tie rounds to the even 0); E5M2 rounds up to
  // 61440 (exclusive) to at most 57344 and flushes at or below 2^-17.
  const Tensor x = Tensor::from_vector(std::vector<float>{1000, -500, 448, 300, 0, 1e-9f, -0.0009f, 0.0011f}, {2, 4});
  const Tensor w = leaf(Tensor::from_vector(std::vector<float>{1, 2, -3, 464, 465, 0.5f, 0.25f, 2e-4f}, {2, 4}));
  const Tensor dy = Tensor::from_vector(std::vector<float>{1e-6f, -8e-6f, 61440, 60000}, {2, 2});
  {
    Float8Guard fp8(ag::Device::kCPU, {.scaling = Float8Scaling::kNone});
    ag::ops::linear(x, w).backward(dy);
  }
  const std::vector<Float8TensorStats> stats = ag::amp::float8_stats({{"fc.weight", w}});
  ASSERT_EQ(stats.size(), 3u);
  const Float8TensorStats& in = find(stats, "fc.weight", Float8Role::kInput);
  EXPECT_EQ(in.format, DType::kFloat8E4M3);
  EXPECT_EQ(in.numel, 8);
  EXPECT_EQ(in.saturated, 2);  // 1000 and -500; 448 is the largest value itself
  EXPECT_EQ(in.flushed, 2);    // 1e-9 and -0.0009 (below 2^-10 = 0.000977); 0.0011 rounds up to 2^-9
  EXPECT_EQ(in.amax, 1000.0f);
  EXPECT_EQ(in.scale, 1.0f);
  EXPECT_DOUBLE_EQ(in.saturated_fraction(), 0.25);
  EXPECT_DOUBLE_EQ(in.headroom_log2(), std::log2(448.0 / 1000.0));
  const Float8TensorStats& wt = find(stats, "fc.weight", Float8Role::kWeight);
  EXPECT_EQ(wt.saturated, 1);  // 465; 464 is the tie that rounds down to 448's even code
  EXPECT_EQ(wt.flushed, 1);    // 2e-4
  const Float8TensorStats& g = find(stats, "fc.weight", Float8Role::kGradOutput);
  EXPECT_EQ(g.format, DType::kFloat8E5M2);
  EXPECT_EQ(g.numel, 4);
  EXPECT_EQ(g.saturated, 1);  // 61440, the tie that rounds up to inf's code; 60000 rounds to 57344
  EXPECT_EQ(g.flushed, 1);    // 1e-6, below 2^-17 = 7.6e-6 (half E5M2's smallest subnormal); -8e-6 rounds up
  EXPECT_EQ(g.step, in.step);
  EXPECT_NE(in.to_string().find("fc.weight input (float8_e4m3fn, scale 2^0): amax 1000, 25% saturated, 25% flushed"),
            std::string::npos)
      << in.to_string();
}

TEST(Float8Diagnostics, CurrentScalingLeavesNothingSaturatedOrFlushed) {
  // The same tiny gradients as WithoutScalingSmallGradientsFlushToZero: unscaled, all flush; scaled
  // by their own amax, none does, and the largest lands on the format's largest value.
  const Tensor x = random_tensor({32, 8}, -1, 1, 23);
  const Tensor g = random_tensor({32, 4}, -1e-6, 1e-6, 24);
  for (auto scaling : {Float8Scaling::kNone, Float8Scaling::kCurrent}) {
    const Tensor w = leaf(random_tensor({4, 8}, -1, 1, 25));
    {
      Float8Guard fp8(ag::Device::kCPU, {.scaling = scaling});
      ag::ops::linear(x, w).backward(g);
    }
    const Float8TensorStats s = find(ag::amp::float8_stats({{"w", w}}), "w", Float8Role::kGradOutput);
    EXPECT_EQ(s.numel, 128);
    EXPECT_EQ(s.saturated, 0);
    if (scaling == Float8Scaling::kNone) {
      EXPECT_EQ(s.flushed, 128);
      EXPECT_DOUBLE_EQ(s.flushed_fraction(), 1.0);
    } else {
      EXPECT_EQ(s.flushed, 0);
      EXPECT_NEAR(s.headroom_log2(), 0.0, 1e-6);  // amax * scale = 57344
    }
  }
}

TEST(Float8Diagnostics, CountsAddUpWithinAStepAndStartAgainInTheNext) {
  const Tensor x = random_tensor({16, 8}, -1, 1, 3);
  const Tensor w = leaf(random_tensor({4, 8}, -1, 1, 4));
  uint64_t first_step = 0;
  {
    Float8Guard fp8(ag::Device::kCPU);
    ag::ops::sum(ag::ops::linear(x, w) + ag::ops::linear(x * 2.0f, w)).backward();  // the weight used twice
    const Float8TensorStats s = find(ag::amp::float8_stats({{"w", w}}), "w", Float8Role::kInput);
    EXPECT_EQ(s.numel, 2 * 16 * 8);
    float largest = 0.0f;
    for (float v : x.to_vector()) largest = std::max(largest, std::fabs(v));
    EXPECT_EQ(s.amax, 2.0f * largest);
    first_step = s.step;
  }
  {
    Float8Guard fp8(ag::Device::kCPU);
    (void)ag::ops::linear(x, w);
  }
  const std::vector<Float8TensorStats> stats = ag::amp::float8_stats({{"w", w}});
  EXPECT_EQ(find(stats, "w", Float8Role::kInput).numel, 16 * 8);
  EXPECT_GT(find(stats, "w", Float8Role::kInput).step, first_step);
  // The gradient's state was not used in the new step: it still reports the old one.
  EXPECT_EQ(find(stats, "w", Float8Role::kGradOutput).step, first_step);
  EXPECT_EQ(find(stats, "w", Float8Role::kGradOutput).numel, 16 * 4 * 2);
  // A parameter no FP8 linear used has no entry.
  EXPECT_TRUE(ag::amp::float8_stats({{"other", leaf(ag::ones({2}))}}).empty());
}

TEST(Float8Diagnostics, TheScaleReportedIsTheOneTheCastsUsed) {
  // Two delayed-scaling steps leave the state a scale of 448 for |x| <= 1; a step without scaling
  // then casts at 1, and that is what the statistics (and the headroom) must say.
  const Tensor x = Tensor::from_vector(std::vector<float>{1000, 1, 1, 1}, {1, 4});
  const Tensor w = leaf(Tensor::from_vector(std::vector<float>{1, 1, 1, 1}, {1, 4}));
  for (int step = 0; step < 2; ++step) {
    Float8Guard fp8(ag::Device::kCPU);
    (void)ag::ops::linear(x * 0.001f, w);
  }
  EXPECT_EQ(find(ag::amp::float8_stats({{"w", w}}), "w", Float8Role::kInput).scale, 448.0f);
  {
    Float8Guard fp8(ag::Device::kCPU, {.scaling = Float8Scaling::kNone});
    (void)ag::ops::linear(x, w);
  }
  const Float8TensorStats s = find(ag::amp::float8_stats({{"w", w}}), "w", Float8Role::kInput);
  EXPECT_EQ(s.scale, 1.0f);
  EXPECT_DOUBLE_EQ(s.headroom_log2(), std::log2(448.0 / 1000.0));
  EXPECT_EQ(s.saturated, 1);
}

TEST(Float8Diagnostics, WithMicroBatchesTheCountsAreTheLatestOnes) {
  // Two micro-batches whose backwards run after both forwards: each forward is a step of its own,
  // each backward casts in its forward's step, and each state reports its latest step only (the
  // documented limit: with micro-batches, the latest one's casts).
  const Tensor w = leaf(random_tensor({4, 8}, -1, 1, 11));
  Tensor y1, y2;
  {
    Float8Guard fp8(ag::Device::kCPU);
    y1 = ag::ops::linear(random_tensor({16, 8}, -1, 1, 12), w);
  }
  {
    Float8Guard fp8(ag::Device::kCPU);
    y2 = ag::ops::linear(random_tensor({16, 8}, -1, 1, 13), w);
  }
  ag::ops::sum(y1).backward();
  const Float8TensorStats after_first = find(ag::amp::float8_stats({{"w", w}}), "w", Float8Role::kGradOutput);
  EXPECT_EQ(after_first.numel, 16 * 4);
  ag::ops::sum(y2).backward();
  const std::vector<Float8TensorStats> stats = ag::amp::float8_stats({{"w", w}});
  const Float8TensorStats& grad = find(stats, "w", Float8Role::kGradOutput);
  EXPECT_EQ(grad.numel, 16 * 4);  // the second backward's alone
  EXPECT_GT(grad.step, after_first.step);
  EXPECT_EQ(grad.step, find(stats, "w", Float8Role::kInput).step);
  EXPECT_EQ(find(stats, "w", Float8Role::kInput).numel, 16 * 8);  // the latest forward's
}

TEST(Float8Diagnostics, DelayedScalingSaturatesOnTheStepOfAJumpAndRecoversTheNext) {
  const Tensor x = random_tensor({64, 8}, -1, 1, 5);
  const Tensor w = leaf(random_tensor({4, 8}, -1, 1, 6));
  std::vector<int64_t> saturated;
  for (float factor : {1.0f, 1.0f, 100.0f, 100.0f}) {
    Float8Guard fp8(ag::Device::kCPU);  // delayed scaling: this step casts with the past steps' amax
    (void)ag::ops::linear(x * factor, w);
    saturated.push_back(find(ag::amp::float8_stats({{"w", w}}), "w", Float8Role::kInput).saturated);
  }
  EXPECT_EQ(saturated[0], 0);  // the first step casts at scale 1: |x| <= 1 fits
  EXPECT_EQ(saturated[1], 0);
  EXPECT_GT(saturated[2], 0);  // the scale maps amax ~1 onto 448: values near 100 clamp
  EXPECT_EQ(saturated[3], 0);  // the history now holds the jump
}

TEST(Float8Diagnostics, TheSkipReportNamesTheFp8CastAnInfWentThrough) {
  ag::manual_seed(3);
  ag::nn::Sequential model{ag::nn::Linear(8, 8), ag::nn::ReLU(), ag::nn::Linear(8, 1)};
  ag::optim::SGD opt(model.parameters(), {.lr = 0.1});
  ag::amp::GradScaler scaler;
  scaler.set_parameter_names(model.named_parameters());
  const Tensor x = random_tensor({16, 8}, -1, 1, 9);
  Tensor loss;
  {
    ag::amp::AutocastGuard autocast(ag::Device::kCPU, DType::kFloat16);
    Float8Guard fp8(ag::Device::kCPU);
    loss = ag::ops::mean(model(x * INFINITY));
  }
  scaler.scale(loss).backward();
  EXPECT_FALSE(scaler.step(opt));
  const ag::amp::SkipReport* report = scaler.last_skip();
  ASSERT_NE(report, nullptr);
  ASSERT_FALSE(report->float8.empty());
  const Float8TensorStats& first = report->float8.front();
  EXPECT_EQ(first.name, "0.weight");
  EXPECT_EQ(first.role, Float8Role::kInput);
  EXPECT_TRUE(std::isinf(first.amax));
  EXPECT_EQ(first.saturated, first.numel);  // every input was +-inf
  // The weights' own casts were finite and fit: they are not listed.
  for (const Float8TensorStats& s : report->float8) EXPECT_NE(s.role, Float8Role::kWeight) << s.to_string();
  EXPECT_NE(report->to_string().find("FP8 casts that met an inf/NaN or saturated: [0.weight input (float8_e4m3fn"),
            std::string::npos)
      << report->to_string();
  scaler.update();
}

TEST(Float8Diagnostics, TensorBoardScalarsPerTensor) {
  const Tensor x = Tensor::from_vector(std::vector<float>{1000, 1, 0.5f, 1e-9f}, {1, 4});
  const Tensor w = leaf(Tensor::from_vector(std::vector<float>{1, 1, 1, 1}, {1, 4}));
  {
    Float8Guard fp8(ag::Device::kCPU, {.scaling = Float8Scaling::kNone});
    ag::ops::linear(x, w).backward(ag::ones({1, 1}));
  }
  const ag::test::ScratchDir dir("float8_log");
  std::string path;
  {
    ag::utils::SummaryWriter writer(dir.dir().string());
    ag::amp::add_float8_stats(writer, ag::amp::float8_stats({{"fc.weight", w}}), 5);
    path = writer.file_path();
  }
  std::map<std::string, float> scalars;
  for (const ag::utils::Event& e : ag::utils::read_events(path)) {
    for (const ag::utils::SummaryValue& v : e.values) {
      EXPECT_EQ(e.step, 5);
      if (v.simple_value) scalars[v.tag] = *v.simple_value;
    }
  }
  EXPECT_FLOAT_EQ(scalars.at("fp8/fc.weight/input/amax"), 1000.0f);
  EXPECT_FLOAT_EQ(scalars.at("fp8/fc.weight/input/saturated"), 0.25f);
  EXPECT_FLOAT_EQ(scalars.at("fp8/fc.weight/input/flushed"), 0.25f);
  EXPECT_FLOAT_EQ(scalars.at("fp8/fc.weight/input/scale_log2"), 0.0f);
  EXPECT_FLOAT_EQ(scalars.at("fp8/fc.weight/input/headroom_log2"), static_cast<float>(std::log2(448.0 / 1000.0)));
  EXPECT_FLOAT_EQ(scalars.at("fp8/fc.weight/grad_output/amax"), 1.0f);
  EXPECT_EQ(scalars.count("fp8/fc.weight/weight/saturated"), 1u);
}

TEST(Float8Diagnostics, TheAmaxHistoryChartRunsOldestToNewest) {
  ag::Float8ScalingState state(4);
  const ag::Float8Recipe recipe{.amax_history_len = 4};
  for (float amax : {2.0f, 8.0f, 4.0f}) {  // three closed steps
    state.record_amax(amax);
    state.update(recipe, DType::kFloat8E4M3);
  }
  state.record_amax(1.0f);  // the step in progress
  const ag::utils::Chart chart = ag::amp::float8_amax_history_chart(state, DType::kFloat8E4M3, "fc.weight input");
  ASSERT_EQ(chart.series.size(), 2u);
  EXPECT_EQ(chart.series[0].x, (std::vector<double>{-3, -2, -1, 0}));
  EXPECT_EQ(chart.series[0].y, (std::vector<double>{2, 8, 4, 1}));
  // The scale came from the window's largest amax, 8: it maps 8 onto 448.
  EXPECT_EQ(chart.series[1].y, (std::vector<double>{8, 8}));
  // A window not yet filled starts at its first step; a later step with amax 0 is a gap.
  ag::Float8ScalingState young(5);
  for (float amax : {3.0f, 0.0f}) {
    young.record_amax(amax);
    young.update({.amax_history_len = 5}, DType::kFloat8E5M2);
  }
  young.record_amax(5.0f);
  const ag::utils::Chart drawn = ag::amp::float8_amax_history_chart(young, DType::kFloat8E5M2, "young");
  EXPECT_EQ(drawn.series[0].x, (std::vector<double>{-2, -1, 0}));
  EXPECT_EQ(drawn.series[0].y[0], 3.0);
  EXPECT_TRUE(std::isnan(drawn.series[0].y[1]));
  EXPECT_EQ(drawn.series[0].y[2], 5.0);
  if (!ag::utils::gnuplot_available()) {
    std::printf("[  SKIPPED ] drawing the chart: gnuplot is not installed\n");
    return;
  }
  const ag::test::ScratchDir dir("float8_chart");
  ag::utils::plot_png(chart, dir.path("amax.png"));
  EXPECT_GT(std::filesystem::file_size(dir.path("amax.png")), 1000u);
}
