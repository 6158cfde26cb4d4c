// Gradient statistics: the format thresholds against real conversions, crafted gradients against a
// float64 count, the one-pass unscale, the recommended scale, and the scaler's schedule.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "amp/diagnostics/grad_stats.h"
#include "amp/diagnostics/grad_stats_log.h"
#include "amp/grad_scaler.h"
#include "amp/unscale.h"
#include "framework/device.h"
#include "framework/dtype.h"
#include "framework/half.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "ops/ops.h"
#include "optim/sgd.h"
#include "test_util.h"
#include "utils/event_reader.h"
#include "utils/summary_writer.h"

namespace ag = ampgrad;
namespace amp = ampgrad::amp;
using ag::DType;
using ag::Tensor;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// float16's facts written out here, independently of the dtype table.
constexpr double kF16Max = 65504.0, kF16MinNormal = 0x1p-14, kF16MinSub = 0x1p-24;

// The float64 reference: where binary16 puts |x| (round to nearest even), by the IEEE definitions.
enum class Where { kZero, kUnderflow, kSubnormal, kNormal, kOverflow, kNaN };
Where f16_reference(double x) {
  const double a = std::fabs(x);
  if (std::isnan(a)) return Where::kNaN;
  if (a == 0) return Where::kZero;
  if (a <= kF16MinSub / 2) return Where::kUnderflow;          // half the smallest subnormal ties to 0
  if (a < kF16MinNormal - kF16MinSub / 2) return Where::kSubnormal;  // the top half-step rounds up to normal
  if (a < kF16Max + 16) return Where::kNormal;                  // 16 = half an ulp at 65504
  return Where::kOverflow;
}

TEST(FormatLimits, AgreeWithRealFloat16Conversions) {
  // Every threshold and its neighbours, plus values across the whole exponent range.
  std::vector<double> xs;
  const amp::FormatLimits f = amp::format_limits(DType::kFloat16);
  for (double t : {f.underflow_max, f.normal_min, f.overflow_min, kF16MinSub, kF16MinNormal, kF16Max}) {
    xs.push_back(t);
    xs.push_back(std::nextafter(t, 0.0));
    xs.push_back(std::nextafter(t, kInf));
  }
  for (int e = -30; e <= 17; ++e) {
    for (double m : {1.0, 1.2345, 1.5, 1.99}) xs.push_back(std::ldexp(m, e));
  }
  for (double x : xs) {
    SCOPED_TRACE(x);
    const float h = ag::half_to_float(ag::double_to_half(x));  // the real rounding
    const Where real = h == 0 ? Where::kZero
                       : std::isinf(h) ? Where::kOverflow
                       : std::fabs(h) < kF16MinNormal ? Where::kSubnormal
                                                      : Where::kNormal;
    const Where ref = f16_reference(x);
    EXPECT_EQ(ref == Where::kUnderflow ? Where::kZero : ref, real);
    const amp::FormatRange got = amp::format_range(x, f);
    const Where mine = got == amp::FormatRange::kUnderflow   ? Where::kUnderflow
                       : got == amp::FormatRange::kSubnormal ? Where::kSubnormal
                       : got == amp::FormatRange::kOverflow  ? Where::kOverflow
                                                             : Where::kNormal;
    EXPECT_EQ(mine, ref);
  }
}

TEST(FormatLimits, ComeFromTheDTypeRows) {
  for (DType dtype : amp::low_precision_dtypes()) {
    SCOPED_TRACE(std::string(ag::dtype_name(dtype)));
    const ag::DTypeInfo& info = ag::dtype_info(dtype);
    const amp::FormatLimits f = amp::format_limits(dtype);
    EXPECT_EQ(f.underflow_max, info.min_subnormal / 2);
    EXPECT_GT(f.overflow_min, info.max);
    EXPECT_LT(f.normal_min, info.min_normal);
  }
  EXPECT_EQ(amp::low_precision_dtypes().front(), DType::kFloat16);
  EXPECT_THROW(amp::format_limits(DType::kInt64), ag::Error);
}

// A gradient with known contents, and its expected counts (for float16) at scale 2^s.
struct Crafted {
  std::vector<double> values;
  int64_t zeros = 0, infs = 0, nans = 0, subnormal = 0, underflow = 0, overflow = 0;
};

Crafted crafted() {
  Crafted c;
  const auto add = [&](double v, int64_t n) {
    for (int64_t i = 0; i < n; ++i) c.values.push_back(i % 2 == 0 ? v : -v);
  };
  add(0.0, 7);
  c.zeros = 7;
  add(0x1p-20, 5);                // float16 subnormal
  add(0x1.8p-15, 4);              // float16 subnormal, just below the normal range
  c.subnormal = 9;
  add(0x1p-26, 3);                // below half the smallest subnormal: float16 rounds it to 0
  add(0x1p-25, 2);                // exactly half: ties to 0
  c.underflow = 5;
  add(70000.0, 2);                // beyond 65520: float16 rounds it to inf
  add(kInf, 1);
  c.overflow = 3;
  c.infs = 1;
  add(kNaN, 2);
  c.nans = 2;
  add(1.0, 6);                    // normal
  add(0x1p-14, 1);                // the smallest normal
  add(65504.0, 1);                // float16's max: finite
  return c;
}

// float64 keeps the values as given; the other dtypes round them (through float32).
Tensor tensor_of(const std::vector<double>& values, DType dtype) {
  const int64_t n = static_cast<int64_t>(values.size());
  if (dtype == DType::kFloat64) return Tensor::from_vector(values, {n}, DType::kFloat64);
  std::vector<float> f(values.begin(), values.end());
  return Tensor::from_vector(f, {n}).to(dtype);
}

// Independent float64 counts of a list of values, at scale `scale`.
struct Reference {
  int64_t zeros = 0, infs = 0, nans = 0, subnormal = 0, underflow = 0, overflow = 0, underflow_unscaled = 0;
  double max_abs = 0;
  std::vector<int64_t> exponents = std::vector<int64_t>(amp::kNumExponentBins, 0);
};

Reference reference(const std::vector<double>& values, double scale) {
  Reference r;
  for (double g : values) {
    if (g == 0) ++r.zeros;
    if (std::isinf(g)) ++r.infs;
    if (std::isnan(g)) ++r.nans;
    if (std::isfinite(g)) r.max_abs = std::max(r.max_abs, std::fabs(g));
    switch (f16_reference(g)) {
      case Where::kSubnormal: ++r.subnormal; break;
      case Where::kUnderflow: ++r.underflow; break;
      case Where::kOverflow: ++r.overflow; break;
      default: break;
    }
    const double v = g / scale;
    if (f16_reference(v) == Where::kUnderflow) ++r.underflow_unscaled;
    const float vf = static_cast<float>(v);
    if (vf != 0 && std::isfinite(vf)) {
      int e = 0;
      std::frexp(static_cast<double>(vf), &e);  // |v| in [2^(e-1), 2^e)
      ++r.exponents[static_cast<size_t>(e - 1 - amp::kMinExponent)];
    }
  }
  return r;
}

void expect_matches(const amp::ParamGradStats& s, const Reference& r) {
  EXPECT_EQ(s.zeros, r.zeros);
  EXPECT_EQ(s.infs, r.infs);
  EXPECT_EQ(s.nans, r.nans);
  EXPECT_EQ(s.max_abs, r.max_abs);
  const amp::FormatStats& f = s.format(DType::kFloat16);
  EXPECT_EQ(f.subnormal, r.subnormal);
  EXPECT_EQ(f.underflow, r.underflow);
  EXPECT_EQ(f.overflow, r.overflow);
  EXPECT_EQ(f.underflow_unscaled, r.underflow_unscaled);
  for (int e = amp::kMinExponent; e <= amp::kMaxExponent; ++e) {
    ASSERT_EQ(s.histogram.count(e), r.exponents[static_cast<size_t>(e - amp::kMinExponent)]) << "exponent " << e;
  }
}

TEST(GradStats, CraftedFloat32GradientMatchesKnownCountsAndFloat64) {
  const Crafted c = crafted();
  Tensor p = ag::zeros({static_cast<int64_t>(c.values.size())});
  p.set_requires_grad(true);
  p.set_grad(tensor_of(c.values, DType::kFloat32));
  const amp::GradStatsReport report = amp::measure_grad_stats({{"w", p}}, 1.0);
  ASSERT_EQ(report.params.size(), 1u);
  const amp::ParamGradStats& s = report.params[0];
  EXPECT_EQ(s.name, "w");
  EXPECT_EQ(s.numel, static_cast<int64_t>(c.values.size()));
  // The counts known by construction ...
  EXPECT_EQ(s.zeros, c.zeros);
  EXPECT_EQ(s.infs, c.infs);
  EXPECT_EQ(s.nans, c.nans);
  EXPECT_EQ(s.format(DType::kFloat16).subnormal, c.subnormal);
  EXPECT_EQ(s.format(DType::kFloat16).underflow, c.underflow);
  EXPECT_EQ(s.format(DType::kFloat16).overflow, c.overflow);
  EXPECT_EQ(s.max_abs, 70000.0);
  EXPECT_LT(s.headroom_log2(DType::kFloat16), 0);  // 70000 already overflows float16
  // ... and everything against the float64 count.
  expect_matches(s, reference(c.values, 1.0));
}

TEST(GradStats, ScaleMovesTheUnscaledUnderflowsOnly) {
  const Crafted c = crafted();
  for (double scale : {1.0, 1024.0, 65536.0, 0.25}) {
    SCOPED_TRACE(scale);
    Tensor p = ag::zeros({static_cast<int64_t>(c.values.size())});
    p.set_requires_grad(true);
    p.set_grad(tensor_of(c.values, DType::kFloat32));
    const amp::GradStatsReport report = amp::measure_grad_stats({{"w", p}}, scale);
    expect_matches(report.params[0], reference(c.values, scale));
    EXPECT_EQ(report.params[0].histogram.max_abs, 70000.0 / scale);
  }
}

TEST(GradStats, Float16AndFloat64GradientsMatchFloat64) {
  ag::manual_seed(3);
  // Random magnitudes over 2^-30 .. 2^20, both signs, plus the crafted edge values.
  std::vector<double> values = crafted().values;
  const std::vector<float> u = ag::uniform({4000}, -30.0, 20.0).to_vector();
  for (size_t i = 0; i < u.size(); ++i) values.push_back((i % 3 == 0 ? -1 : 1) * std::exp2(static_cast<double>(u[i])));
  for (DType dtype : {DType::kFloat16, DType::kFloat64}) {
    SCOPED_TRACE(std::string(ag::dtype_name(dtype)));
    const Tensor g = tensor_of(values, dtype);
    // The reference sees the stored values (float16 rounds them).
    std::vector<double> stored;
    for (float v : g.to_vector()) stored.push_back(v);
    if (dtype == DType::kFloat64) stored.assign(values.begin(), values.end());
    Tensor p = ag::zeros({g.numel()}, dtype);
    p.set_requires_grad(true);
    p.set_grad(g);
    const amp::GradStatsReport report = amp::measure_grad_stats({{"w", p}}, 8.0);
    EXPECT_EQ(report.params[0].grad_dtype, dtype);
    expect_matches(report.params[0], reference(stored, 8.0));
  }
}

TEST(GradStats, LargeGradientsAreCountedAcrossThreadPieces) {
  // Larger than one parallel piece, so several pieces merge their counts.
  const int64_t n = 300001;
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = i % 10 == 0 ? 0.0 : std::ldexp(1.0, -int(i % 40));
  Tensor p = ag::zeros({n});
  p.set_requires_grad(true);
  p.set_grad(tensor_of(values, DType::kFloat32));
  const amp::GradStatsReport report = amp::measure_grad_stats({{"big", p}}, 4.0);
  expect_matches(report.params[0], reference(values, 4.0));
}

TEST(GradStats, OnePassUnscaleWritesTheSameValuesAndFlag) {
  ag::manual_seed(5);
  for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
    SCOPED_TRACE(std::string(ag::dtype_name(dtype)));
    const Tensor g = (ag::randn({1000}) * 1e-3f).to(dtype);
    std::vector<Tensor> a_out{ag::zeros({1000})}, b_out{ag::zeros({1000})};
    const bool a = amp::unscale_and_check_all({g}, 1.0 / 1024, a_out);
    std::vector<amp::GradCounts> counts;
    const bool b = amp::unscale_check_and_measure_all({g}, 1.0 / 1024, b_out,
                                                      amp::make_format_table(amp::low_precision_dtypes()), counts);
    EXPECT_EQ(a, b);
    EXPECT_FALSE(a);
    EXPECT_EQ(a_out[0].to_vector(), b_out[0].to_vector());
    ASSERT_EQ(counts.size(), 1u);
    EXPECT_EQ(counts[0].unscaled_nonfinite, 0);
  }
  // An inf sets the flag in both.
  const Tensor bad = Tensor::from_vector(std::vector<float>{1.0f, std::numeric_limits<float>::infinity()}, {2});
  std::vector<Tensor> out{ag::zeros({2})};
  std::vector<amp::GradCounts> counts;
  EXPECT_TRUE(amp::unscale_check_and_measure_all({bad}, 0.5, out, amp::FormatTable{}, counts));
  EXPECT_EQ(counts[0].infs, 1);
}

TEST(GradStats, AnyNonfinite) {
  EXPECT_FALSE(amp::any_nonfinite(ag::ones({3})));
  EXPECT_TRUE(amp::any_nonfinite(Tensor::from_vector(std::vector<float>{1.0f, NAN}, {2}).to(DType::kFloat16)));
  EXPECT_FALSE(amp::any_nonfinite(Tensor::from_vector(std::vector<int64_t>{1, 2}, {2})));
}

TEST(RecommendScale, LargestPowerOfTwoKeepingTheMaximumFinite) {
  // Values v with max |v| = 0.75 * 2^-3: float16's max 65504 allows 2^k * 0.09375 <= 65504, k = 19
  // (2^19 * 0.09375 = 49152; 2^20 gives 98304 > 65504).
  std::vector<double> values = {0.75 * 0x1p-3, 0x1p-10, 0x1p-30, 0x1p-40};
  Tensor p = ag::zeros({4});
  p.set_requires_grad(true);
  p.set_grad(tensor_of(values, DType::kFloat32));
  const amp::GradStatsReport report = amp::measure_grad_stats({{"w", p}});
  const amp::ScaleRecommendation r = amp::recommend_scale(report.params[0].histogram, {.max_underflow_fraction = 0.3});
  EXPECT_EQ(r.log2_scale, 19);
  EXPECT_EQ(r.scale, 0x1p19);
  // At 2^19: 2^-40 * 2^19 = 2^-21 is kept; 2^-30 * 2^19 = 2^-11 too: no underflow.
  EXPECT_EQ(r.underflow_fraction, 0.0);
  EXPECT_TRUE(r.meets_underflow);
  // Brute force over every k: the recommendation is the largest k whose scaled maximum is finite.
  for (int k = 0; k <= 30; ++k) {
    const bool finite = std::ldexp(values[0], k) <= 65504.0;
    EXPECT_EQ(finite, k <= r.log2_scale) << k;
  }
  // A margin of two doublings.
  EXPECT_EQ(amp::recommend_scale(report.params[0].histogram, {.margin_log2 = 2}).log2_scale, 17);
}

TEST(RecommendScale, FlagsAnUnderflowItCannotAvoid) {
  // max 2^10 allows only k <= 5, and then 2^-40 * 2^5 still underflows float16: 1 of 2 values.
  std::vector<double> values = {1024.0, 0x1p-40};
  Tensor p = ag::zeros({2});
  p.set_requires_grad(true);
  p.set_grad(tensor_of(values, DType::kFloat32));
  const amp::GradStatsReport report = amp::measure_grad_stats({{"w", p}});
  const amp::ScaleRecommendation r = amp::recommend_scale(report.params[0].histogram, {.max_underflow_fraction = 0.1});
  EXPECT_EQ(r.log2_scale, 5);
  EXPECT_DOUBLE_EQ(r.underflow_fraction, 0.5);
  EXPECT_FALSE(r.meets_underflow);
  // No nonzero value: nothing to go by.
  amp::ExponentHistogram empty;
  empty.zeros = 5;
  EXPECT_TRUE(amp::recommend_scale(empty).empty);
  EXPECT_THROW(amp::recommend_scale(empty, {.max_underflow_fraction = 2}), ag::Error);
}

TEST(GradScalerStats, MeasuredOnTheirScheduleWithNames) {
  ag::manual_seed(7);
  ag::nn::Sequential model{ag::nn::Linear(4, 8), ag::nn::Linear(8, 1)};
  ag::optim::SGD opt(model.parameters(), {.lr = 0.01});
  amp::GradScaler scaler({.init_scale = 1024});
  scaler.set_parameter_names(model.named_parameters());
  scaler.set_grad_stats_interval(2);
  const Tensor x = ag::randn({16, 4}), y = ag::randn({16, 1});
  std::vector<int64_t> measured;
  for (int step = 0; step < 5; ++step) {
    opt.zero_grad();
    if (step == 3) scaler.request_grad_stats();  // a one-off, on top of the schedule
    scaler.scale(ag::ops::mse_loss(model(x), y)).backward();
    // Gradients as the backward left them (scaled), for the float64 check below.
    std::vector<std::vector<double>> scaled;
    for (const Tensor& p : model.parameters()) {
      const std::vector<float> g = p.grad().to_vector();
      scaled.emplace_back(g.begin(), g.end());
    }
    scaler.step(opt);
    const amp::GradStatsReport* report = scaler.grad_stats();
    if (report != nullptr && report->iteration == step) {
      measured.push_back(step);
      ASSERT_EQ(report->params.size(), 4u);
      EXPECT_EQ(report->params[0].name, "0.weight");
      EXPECT_EQ(report->params[3].name, "1.bias");
      EXPECT_EQ(report->scale, 1024.0);
      for (size_t k = 0; k < 4; ++k) expect_matches(report->params[k], reference(scaled[k], 1024.0));
      EXPECT_NE(report->to_string().find("0.weight"), std::string::npos);
    }
    scaler.update();
  }
  EXPECT_EQ(measured, (std::vector<int64_t>{0, 2, 3, 4}));
  EXPECT_THROW(scaler.set_grad_stats_interval(-1), ag::Error);
}

// The diagnostics live in an object the scaler holds by pointer: a moved scaler takes them along
// (names, schedule, the reports so far) with its scale.
TEST(GradScalerStats, AMovedScalerKeepsItsScheduleNamesAndReports) {
  ag::manual_seed(7);
  ag::nn::Sequential model{ag::nn::Linear(4, 8), ag::nn::Linear(8, 1)};
  ag::optim::SGD opt(model.parameters(), {.lr = 0.01});
  amp::GradScaler first({.init_scale = 1024});
  first.set_parameter_names(model.named_parameters());
  first.set_grad_stats_interval(1);
  const Tensor x = ag::randn({16, 4}), y = ag::randn({16, 1});
  const auto train_step = [&](amp::GradScaler& scaler) {
    opt.zero_grad();
    scaler.scale(ag::ops::mse_loss(model(x), y)).backward();
    EXPECT_TRUE(scaler.step(opt));
    scaler.update();
  };
  train_step(first);
  ASSERT_NE(first.grad_stats(), nullptr);
  amp::GradScaler moved(std::move(first));
  ASSERT_NE(moved.grad_stats(), nullptr);
  EXPECT_EQ(moved.grad_stats()->iteration, 0);
  EXPECT_EQ(moved.iteration(), 1);
  train_step(moved);
  ASSERT_NE(moved.grad_stats(), nullptr);
  EXPECT_EQ(moved.grad_stats()->iteration, 1);
  EXPECT_EQ(moved.grad_stats()->params[0].name, "0.weight");
  EXPECT_EQ(moved.get_scale(), 1024.0);
  amp::GradScaler assigned;
  assigned = std::move(moved);
  EXPECT_EQ(assigned.grad_stats()->iteration, 1);
  EXPECT_EQ(assigned.get_scale(), 1024.0);
}

TEST(GradStatsLog, ExponentHistogramBucketsAreTheBins) {
  amp::ExponentHistogram h;
  EXPECT_EQ(amp::exponent_histogram_proto(h).num, 0);
  h.counts[static_cast<size_t>(-20 - amp::kMinExponent)] = 3;
  h.counts[static_cast<size_t>(-18 - amp::kMinExponent)] = 2;
  h.zeros = 9;  // left out
  const ag::utils::Histogram p = amp::exponent_histogram_proto(h);
  EXPECT_EQ(p.bucket_limit, (std::vector<double>{-20, -19, -18, -17}));
  EXPECT_EQ(p.bucket, (std::vector<double>{0, 3, 0, 2}));
  EXPECT_EQ(p.num, 5);
  EXPECT_EQ(p.min, -20);
  EXPECT_EQ(p.max, -17);
  EXPECT_DOUBLE_EQ(p.sum, 3 * -19.5 + 2 * -17.5);
  EXPECT_DOUBLE_EQ(p.sum_squares, 3 * 19.5 * 19.5 + 2 * 17.5 * 17.5);
}

TEST(GradStatsLog, WritesScalarsAndHistogramsThatReadBack) {
  const Crafted c = crafted();
  Tensor p = ag::zeros({static_cast<int64_t>(c.values.size())});
  p.set_requires_grad(true);
  p.set_grad(tensor_of(c.values, DType::kFloat32));
  Tensor q = ag::zeros({2});
  q.set_requires_grad(true);
  q.set_grad(Tensor::from_vector(std::vector<float>{0x1p-3f, 0.0f}, {2}));
  const amp::GradStatsReport report = amp::measure_grad_stats({{"layer.w", p}, {"layer.b", q}}, 1024.0, 7);
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("grad_stats_log_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::string path;
  {
    ag::utils::SummaryWriter writer(dir.string());
    amp::add_grad_stats(writer, report, 7);
    path = writer.file_path();
  }
  std::map<std::string, float> scalars;
  std::map<std::string, ag::utils::Histogram> histograms;
  for (const ag::utils::Event& e : ag::utils::read_events(path)) {
    for (const ag::utils::SummaryValue& v : e.values) {
      EXPECT_EQ(e.step, 7);
      if (v.simple_value) scalars[v.tag] = *v.simple_value;
      if (v.histo) histograms[v.tag] = *v.histo;
    }
  }
  const double n = static_cast<double>(c.values.size());
  EXPECT_FLOAT_EQ(scalars.at("grad/layer.w/zero"), static_cast<float>(c.zeros / n));
  EXPECT_FLOAT_EQ(scalars.at("grad/layer.w/subnormal"), static_cast<float>(c.subnormal / n));
  EXPECT_FLOAT_EQ(scalars.at("grad/layer.w/underflow"), static_cast<float>(c.underflow / n));
  EXPECT_FLOAT_EQ(scalars.at("grad/layer.w/overflow"), static_cast<float>(c.overflow / n));
  EXPECT_FLOAT_EQ(scalars.at("grad/layer.w/max_abs"), 70000.0f);
  EXPECT_FLOAT_EQ(scalars.at("grad/layer.b/zero"), 0.5f);
  EXPECT_FLOAT_EQ(scalars.at("grad/layer.b/headroom_log2"), static_cast<float>(std::log2(65504.0 / 0.125)));
  EXPECT_FLOAT_EQ(scalars.at("grad/all/zero"), static_cast<float>((c.zeros + 1) / (n + 2)));
  EXPECT_FLOAT_EQ(scalars.at("amp/scale_log2"), 10.0f);
  const amp::ScaleRecommendation r = amp::recommend_scale(report.total().histogram);
  EXPECT_FLOAT_EQ(scalars.at("amp/recommended_scale_log2"), static_cast<float>(r.log2_scale));
  // The histogram of layer.b: one value, 2^-3 / 1024 = 2^-13.
  const ag::utils::Histogram& hb = histograms.at("grad_exponent/layer.b");
  EXPECT_EQ(hb.bucket_limit, (std::vector<double>{-13, -12}));
  EXPECT_EQ(hb.bucket, (std::vector<double>{0, 1}));
  // The total's buckets hold every nonzero finite unscaled value.
  EXPECT_EQ(histograms.at("grad_exponent/all").num, static_cast<double>(report.total().histogram.nonzero_finite()));
  std::filesystem::remove_all(dir);
}

TEST(GradStatsLog, RawHistogramsAreChecked) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("raw_histogram_" + std::to_string(::getpid()));
  ag::utils::SummaryWriter writer(dir.string());
  const auto raw = [&](std::vector<double> limits, std::vector<double> counts, double num) {
    ag::utils::Histogram h{.num = num};
    h.bucket_limit = std::move(limits);
    h.bucket = std::move(counts);
    writer.add_histogram_raw("h", h, 0);
  };
  EXPECT_NO_THROW(raw({1, 2}, {0, 3}, 3));
  EXPECT_THROW(raw({1, 2}, {3}, 3), ag::Error);      // lengths differ
  EXPECT_THROW(raw({2, 1}, {0, 3}, 3), ag::Error);   // limits decrease
  EXPECT_THROW(raw({1, 2}, {0, -1}, -1), ag::Error); // negative count
  EXPECT_THROW(raw({1, 2}, {0, 3}, 4), ag::Error);   // num is not the sum
  EXPECT_THROW(raw({}, {}, 0), ag::Error);
  writer.close();
  std::filesystem::remove_all(dir);
}

TEST(GradStatsCuda, MatchesTheCpu) {
  if (!ag::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  ag::manual_seed(11);
  std::vector<double> values = crafted().values;
  const std::vector<float> u = ag::uniform({50000}, -30.0, 20.0).to_vector();
  for (float e : u) values.push_back(std::exp2(static_cast<double>(e)));
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kFloat64}) {
    SCOPED_TRACE(std::string(ag::dtype_name(dtype)));
    const Tensor g = tensor_of(values, dtype);
    const amp::FormatTable table = amp::make_format_table(amp::low_precision_dtypes());
    std::vector<amp::GradCounts> cpu, gpu;
    std::vector<Tensor> cpu_out{ag::zeros({g.numel()})};
    std::vector<Tensor> gpu_out{ag::zeros({g.numel()}, DType::kFloat32, ag::Device::kCUDA)};
    const bool cpu_bad = amp::unscale_check_and_measure_all({g}, 1.0 / 64, cpu_out, table, cpu);
    const bool gpu_bad = amp::unscale_check_and_measure_all({g.to(ag::Device::kCUDA)}, 1.0 / 64, gpu_out, table, gpu);
    EXPECT_EQ(cpu_bad, gpu_bad);
    const std::vector<float> a = cpu_out[0].to_vector(), b = gpu_out[0].to_vector();
    for (size_t i = 0; i < a.size(); ++i) {
      if (!(std::isnan(a[i]) && std::isnan(b[i]))) {
        ASSERT_EQ(a[i], b[i]) << i;
      }
    }
    const auto names = amp::low_precision_dtypes();
    const amp::ParamGradStats c = amp::make_param_stats("g", dtype, g.numel(), 64, cpu[0], names);
    const amp::ParamGradStats d = amp::make_param_stats("g", dtype, g.numel(), 64, gpu[0], names);
    EXPECT_EQ(c.zeros, d.zeros);
    EXPECT_EQ(c.infs, d.infs);
    EXPECT_EQ(c.nans, d.nans);
    EXPECT_EQ(c.max_abs, d.max_abs);
    EXPECT_EQ(c.histogram.counts, d.histogram.counts);
    for (size_t f = 0; f < c.formats.size(); ++f) {
      EXPECT_EQ(c.formats[f].subnormal, d.formats[f].subnormal);
      EXPECT_EQ(c.formats[f].underflow, d.formats[f].underflow);
      EXPECT_EQ(c.formats[f].overflow, d.formats[f].overflow);
      EXPECT_EQ(c.formats[f].underflow_unscaled, d.formats[f].underflow_unscaled);
    }
  }
}

}  // namespace
