// Gradient statistics as TensorBoard scalars and histograms.
#include "amp/diagnostics/grad_stats_log.h"

#include <cmath>
#include <string>
#include <vector>

namespace ampgrad::amp {

utils::Histogram exponent_histogram_proto(const ExponentHistogram& histogram) {
  utils::Histogram out;
  const int lo = histogram.min_exponent(), hi = histogram.max_exponent();
  if (lo > hi) return out;
  out.min = lo;
  out.max = hi + 1;
  out.bucket_limit.push_back(lo);  // the empty bucket left of the first one
  out.bucket.push_back(0);
  for (int e = lo; e <= hi; ++e) {
    const double n = static_cast<double>(histogram.count(e));
    const double mid = e + 0.5;
    out.bucket_limit.push_back(e + 1);
    out.bucket.push_back(n);
    out.num += n;
    out.sum += n * mid;
    out.sum_squares += n * mid * mid;
  }
  return out;
}

namespace {

void add_param(utils::SummaryWriter& writer, const std::string& name, const ParamGradStats& p, DType dtype,
               int64_t step) {
  const FormatStats& f = p.format(dtype);
  const std::string prefix = "grad/" + name + "/";
  writer.add_scalar(prefix + "zero", p.fraction(p.zeros), step);
  writer.add_scalar(prefix + "subnormal", p.fraction(f.subnormal), step);
  writer.add_scalar(prefix + "underflow", p.fraction(f.underflow), step);
  writer.add_scalar(prefix + "overflow", p.fraction(f.overflow), step);
  writer.add_scalar(prefix + "underflow_unscaled", p.fraction(f.underflow_unscaled), step);
  writer.add_scalar(prefix + "max_abs", p.max_abs, step);
  const double headroom = p.headroom_log2(dtype);
  if (std::isfinite(headroom)) writer.add_scalar(prefix + "headroom_log2", headroom, step);
  const utils::Histogram h = exponent_histogram_proto(p.histogram);
  if (h.num > 0) writer.add_histogram_raw("grad_exponent/" + name, h, step);
}

}  // namespace

void add_grad_stats(utils::SummaryWriter& writer, const GradStatsReport& report, int64_t step,
                    const GradStatsLogOptions& options) {
  if (options.per_parameter) {
    for (const ParamGradStats& p : report.params) add_param(writer, p.name, p, options.dtype, step);
  }
  const ParamGradStats total = report.total();
  add_param(writer, "all", total, options.dtype, step);
  writer.add_scalar("amp/scale_log2", std::log2(report.scale), step);
  RecommendScaleOptions recommend = options.recommend;
  recommend.dtype = options.dtype;
  const ScaleRecommendation r = recommend_scale(total.histogram, recommend);
  if (!r.empty) {
    writer.add_scalar("amp/recommended_scale_log2", r.log2_scale, step);
    writer.add_scalar("amp/recommended_underflow", r.underflow_fraction, step);
  }
}

void add_scaler_state(utils::SummaryWriter& writer, const GradScaler& scaler, bool stepped, int64_t step) {
  writer.add_scalar("amp/scale", scaler.get_scale(), step);
  writer.add_scalar("amp/skipped", stepped ? 0.0 : 1.0, step);
}

}  // namespace ampgrad::amp
