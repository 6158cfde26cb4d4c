// Gradient statistics: counts made into per-parameter figures, the report table and the
// recommended loss scale.
#include "amp/diagnostics/grad_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "amp/unscale.h"
#include "framework/error.h"

namespace ampgrad::amp {

std::vector<DType> low_precision_dtypes() {
  std::vector<DType> out;
  for (DType dtype : kAllDTypes) {
    if (is_low_precision(dtype)) out.push_back(dtype);
  }
  return out;
}

FormatLimits format_limits(DType dtype) {
  AG_CHECK(is_floating(dtype), "format_limits: ", dtype, " is not a floating dtype");
  const DTypeInfo& i = dtype_info(dtype);
  // max = (2 - eps) 2^E, so max / (2 - eps) = 2^E exactly and half an ulp of max is 2^E eps / 2.
  return {.dtype = dtype,
          .underflow_max = i.min_subnormal / 2,
          .normal_min = i.min_normal - i.min_subnormal / 2,
          .overflow_min = i.max + i.max / (2 - i.eps) * (i.eps / 2)};
}

FormatTable make_format_table(const std::vector<DType>& formats) {
  AG_CHECK(formats.size() <= static_cast<size_t>(kMaxFormats), "gradient statistics: ", formats.size(),
           " formats, at most ", kMaxFormats, " are measured in one pass");
  FormatTable table;
  table.count = static_cast<int>(formats.size());
  for (size_t f = 0; f < formats.size(); ++f) table.formats[f] = format_limits(formats[f]);
  return table;
}

int64_t ExponentHistogram::count(int exponent) const {
  if (exponent < kMinExponent || exponent > kMaxExponent) return 0;
  return counts[static_cast<size_t>(exponent - kMinExponent)];
}

int64_t ExponentHistogram::nonzero_finite() const {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  return n;
}

int ExponentHistogram::min_exponent() const {
  for (int e = kMinExponent; e <= kMaxExponent; ++e) {
    if (count(e) > 0) return e;
  }
  return kMaxExponent + 1;
}

int ExponentHistogram::max_exponent() const {
  for (int e = kMaxExponent; e >= kMinExponent; --e) {
    if (count(e) > 0) return e;
  }
  return kMinExponent - 1;
}

ExponentHistogram& ExponentHistogram::operator+=(const ExponentHistogram& other) {
  for (size_t b = 0; b < counts.size(); ++b) counts[b] += other.counts[b];
  zeros += other.zeros;
  nonfinite += other.nonfinite;
  max_abs = std::max(max_abs, other.max_abs);
  return *this;
}

double ParamGradStats::fraction(int64_t count) const {
  return numel > 0 ? static_cast<double>(count) / static_cast<double>(numel) : 0.0;
}

const FormatStats& ParamGradStats::format(DType dtype) const {
  for (const FormatStats& f : formats) {
    if (f.dtype == dtype) return f;
  }
  AG_FAIL("ParamGradStats::format: ", dtype, " was not measured for '", name,
          "'; hint: the statistics measure the low-precision dtypes");
}

double ParamGradStats::headroom_log2(DType dtype) const {
  if (max_abs == 0) return std::numeric_limits<double>::infinity();
  return std::log2(dtype_info(dtype).max / max_abs);
}

ParamGradStats& ParamGradStats::operator+=(const ParamGradStats& other) {
  numel += other.numel;
  zeros += other.zeros;
  infs += other.infs;
  nans += other.nans;
  max_abs = std::max(max_abs, other.max_abs);
  for (const FormatStats& o : other.formats) {
    auto it = std::find_if(formats.begin(), formats.end(), [&](const FormatStats& f) { return f.dtype == o.dtype; });
    if (it == formats.end()) {
      formats.push_back(o);
      continue;
    }
    it->subnormal += o.subnormal;
    it->underflow += o.underflow;
    it->overflow += o.overflow;
    it->underflow_unscaled += o.underflow_unscaled;
  }
  histogram += other.histogram;
  return *this;
}

ParamGradStats make_param_stats(const std::string& name, DType grad_dtype, int64_t numel, double scale,
                                const GradCounts& counts, const std::vector<DType>& formats) {
  ParamGradStats s{.name = name,
                   .grad_dtype = grad_dtype,
                   .numel = numel,
                   .zeros = counts.zeros,
                   .infs = counts.infs,
                   .nans = counts.nans,
                   .max_abs = counts.max_abs};
  for (size_t f = 0; f < formats.size(); ++f) {
    s.formats.push_back({.dtype = formats[f],
                         .subnormal = counts.subnormal[f],
                         .underflow = counts.underflow[f],
                         .overflow = counts.overflow[f],
                         .underflow_unscaled = counts.underflow_unscaled[f]});
  }
  std::copy(std::begin(counts.exponent), std::end(counts.exponent), s.histogram.counts.begin());
  s.histogram.zeros = counts.unscaled_zeros;
  s.histogram.nonfinite = counts.unscaled_nonfinite;
  s.histogram.max_abs = counts.max_abs / scale;
  return s;
}

GradStatsReport measure_grad_stats(const std::vector<std::pair<std::string, Tensor>>& named, double scale,
                                   int64_t iteration) {
  AG_CHECK(std::isfinite(scale) && scale > 0, "measure_grad_stats: scale must be finite and > 0, got ", scale);
  std::vector<std::string> names;
  std::vector<Tensor> grads;
  for (const auto& [name, tensor] : named) {
    if (!tensor.defined() || !tensor.grad().defined()) continue;
    names.push_back(name);
    grads.push_back(tensor.grad());
  }
  const std::vector<DType> formats = low_precision_dtypes();
  std::vector<GradCounts> counts;
  measure_all(grads, 1.0 / scale, make_format_table(formats), counts);
  GradStatsReport report{.iteration = iteration, .scale = scale};
  for (size_t k = 0; k < grads.size(); ++k) {
    report.params.push_back(make_param_stats(names[k], grads[k].dtype(), grads[k].numel(), scale, counts[k], formats));
  }
  return report;
}

ParamGradStats GradStatsReport::total() const {
  ParamGradStats all{.name = "(all)"};
  for (const ParamGradStats& p : params) all += p;
  return all;
}

std::string format_scale(double scale) {
  char text[64];
  int exponent = 0;
  if (scale > 0 && std::isfinite(scale) && std::frexp(scale, &exponent) == 0.5) {
    std::snprintf(text, sizeof(text), "2^%d", exponent - 1);
  } else {
    std::snprintf(text, sizeof(text), "%.5g", scale);
  }
  return text;
}

std::string GradStatsReport::to_string(DType dtype) const {
  std::ostringstream out;
  const std::string f = std::string(dtype_name(dtype));
  char line[256];
  std::snprintf(line, sizeof(line), "gradients at scale %s (iteration %lld), against %s:\n", format_scale(scale).c_str(),
                static_cast<long long>(iteration), f.c_str());
  out << line;
  std::snprintf(line, sizeof(line), "%-24s %9s %7s %9s %9s %9s %10s %9s %12s\n", "parameter", "numel", "zero",
                "subnormal", "underflow", "overflow", "max |g|", "headroom", "unscaled: 0");
  out << line;
  std::vector<ParamGradStats> rows = params;
  if (params.size() > 1) rows.push_back(total());
  for (const ParamGradStats& p : rows) {
    const FormatStats& s = p.format(dtype);
    const double headroom = p.headroom_log2(dtype);
    char room[32];
    if (std::isinf(headroom)) {
      std::snprintf(room, sizeof(room), "-");
    } else {
      std::snprintf(room, sizeof(room), "2^%.1f", headroom);
    }
    std::snprintf(line, sizeof(line), "%-24s %9lld %6.1f%% %8.1f%% %8.1f%% %8.1f%% %10.3e %9s %11.1f%%\n",
                  p.name.c_str(), static_cast<long long>(p.numel), 100 * p.fraction(p.zeros),
                  100 * p.fraction(s.subnormal), 100 * p.fraction(s.underflow), 100 * p.fraction(s.overflow),
                  p.max_abs, room, 100 * p.fraction(s.underflow_unscaled));
    out << line;
  }
  return out.str();
}

namespace {

// Nonzero finite values that round to 0 in the format at scale 2^k, by whole bins.
int64_t underflows_at(const ExponentHistogram& h, int k, double underflow_max) {
  int64_t n = 0;
  for (int e = kMinExponent; e <= kMaxExponent; ++e) {
    // Bin e scaled is [2^(e+k), 2^(e+k+1)): all of it rounds to 0 when its top is <= underflow_max.
    if (std::ldexp(1.0, e + k + 1) <= underflow_max) n += h.count(e);
  }
  return n;
}

}  // namespace

ScaleRecommendation recommend_scale(const ExponentHistogram& histogram, const RecommendScaleOptions& options) {
  AG_CHECK(is_floating(options.dtype), "recommend_scale: ", options.dtype, " is not a floating dtype");
  AG_CHECK(options.max_underflow_fraction >= 0 && options.max_underflow_fraction <= 1,
           "recommend_scale: max_underflow_fraction must be in [0, 1], got ", options.max_underflow_fraction);
  AG_CHECK(options.margin_log2 >= 0, "recommend_scale: margin_log2 must be >= 0, got ", options.margin_log2);
  constexpr int kLowest = -126, kHighest = 127;  // the scaler keeps its scale a normal float32
  ScaleRecommendation r;
  r.saw_nonfinite = histogram.nonfinite > 0;
  const int64_t nonzero = histogram.nonzero_finite();
  if (nonzero == 0 || histogram.max_abs <= 0) {
    r.empty = true;
    return r;
  }
  const double bound = std::ldexp(dtype_info(options.dtype).max, -options.margin_log2);
  // The largest k with max_abs * 2^k <= bound: a first guess from log2, then exact steps (ldexp is exact).
  int k = static_cast<int>(std::floor(std::log2(bound / histogram.max_abs)));
  k = std::clamp(k, kLowest - 1, kHighest + 1);
  while (k > kLowest && std::ldexp(histogram.max_abs, k) > bound) --k;
  while (k < kHighest && std::ldexp(histogram.max_abs, k + 1) <= bound) ++k;
  k = std::clamp(k, kLowest, kHighest);
  r.log2_scale = k;
  r.scale = std::ldexp(1.0, k);
  r.underflow_fraction = static_cast<double>(underflows_at(histogram, k, format_limits(options.dtype).underflow_max)) /
                         static_cast<double>(nonzero);
  r.meets_underflow = r.underflow_fraction <= options.max_underflow_fraction;
  return r;
}

}  // namespace ampgrad::amp
