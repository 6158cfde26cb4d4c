// Trains a small MLP with Adam on a teacher-student regression whose loss carries a 1e-4
// weight, so the true gradients (1e-5..1e-8) sit at or below FP16's subnormal range. BF16 holds
// such gradients (FP32's exponent range), but its 8 significand bits lose small weight updates.
#include "examples/underflow.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

namespace underflow {

namespace ag = ampgrad;

std::string mode_name(Mode mode) {
  switch (mode) {
    case Mode::kFp32: return "fp32";
    case Mode::kFp16NoScaling: return "fp16, no loss scaling";
    case Mode::kFp16StaticScale: return "fp16, static scale 2^20";
    case Mode::kFp16DynamicScale: return "fp16, dynamic GradScaler";
    case Mode::kBf16NoScaling: return "bf16, no loss scaling";
    case Mode::kBf16ParamsNoMasters: return "bf16 params, no masters";
    case Mode::kBf16ParamsMasters: return "bf16 params, fp32 masters";
    case Mode::kBf16ParamsStochastic: return "bf16 params, stochastic rounding";
    case Mode::kFp8NoScaling: return "fp8, no scaling";
    case Mode::kFp8CurrentScaling: return "fp8, current scaling";
    case Mode::kFp8DelayedScaling: return "fp8, delayed scaling";
  }
  return "?";
}

Result train(Mode mode, const Config& config) {
  const ag::Device dev = config.device;
  ag::manual_seed(1234);
  // Teacher: a fixed random MLP; student: a fresh one of the same shape.
  ag::nn::Sequential teacher{ag::nn::Linear(32, 64), ag::nn::ReLU(), ag::nn::Linear(64, 1)};
  ag::nn::Sequential model{ag::nn::Linear(32, 64), ag::nn::ReLU(), ag::nn::Linear(64, 1)};
  teacher.to(dev);
  model.to(dev);
  const bool bf16_params =
      mode == Mode::kBf16ParamsNoMasters || mode == Mode::kBf16ParamsMasters || mode == Mode::kBf16ParamsStochastic;
  if (bf16_params) model.to(ag::DType::kBFloat16);  // before the optimizer, which makes the masters
  const ag::Tensor x = ag::randn({256, 32}).to(dev);
  ag::Tensor y;
  {
    ag::NoGradGuard no_grad;
    y = teacher(x);
  }

  ag::optim::Adam opt(model.parameters(), {.lr = 1e-3});
  if (mode == Mode::kBf16ParamsNoMasters) opt.set_master_weights(ag::optim::MasterWeights::kNone);
  if (mode == Mode::kBf16ParamsStochastic) opt.set_master_weights(ag::optim::MasterWeights::kStochasticRounding);
  const bool scaled = mode == Mode::kFp16StaticScale || mode == Mode::kFp16DynamicScale;
  const bool low = mode != Mode::kFp32;
  const bool fp8_mode = mode == Mode::kFp8NoScaling || mode == Mode::kFp8CurrentScaling || mode == Mode::kFp8DelayedScaling;
  const ag::amp::Float8Scaling fp8_scaling = mode == Mode::kFp8NoScaling        ? ag::amp::Float8Scaling::kNone
                                             : mode == Mode::kFp8CurrentScaling ? ag::amp::Float8Scaling::kCurrent
                                                                                : ag::amp::Float8Scaling::kDelayed;
  const ag::DType autocast_dtype = scaled || mode == Mode::kFp16NoScaling ? ag::DType::kFloat16 : ag::DType::kBFloat16;
  ag::amp::GradScalerOptions scaler_options{.growth_interval = config.dynamic_growth_interval, .enabled = scaled};
  if (mode == Mode::kFp16StaticScale) {
    // A static scale is a scaler whose scale cannot move; it still skips steps that overflow.
    scaler_options.init_scale = scaler_options.min_scale = scaler_options.max_scale = config.static_scale;
  }
  ag::amp::GradScaler scaler(scaler_options);
  if (mode == Mode::kFp16DynamicScale) {
    scaler.set_parameter_names(model.named_parameters());
    scaler.set_grad_stats_interval(config.stats_every);
  }

  // The weights a step updates: FP32 parameters, the FP32 masters of BF16 ones, or (without masters)
  // the BF16 parameters themselves.
  const auto stored_weights = [&] {
    std::vector<float> all;
    for (size_t i = 0; i < opt.parameters().size(); ++i) {
      const ag::Tensor& p = opt.parameters()[i];
      const bool own = p.dtype() == ag::DType::kFloat32 || opt.master_weights() != ag::optim::MasterWeights::kFp32;
      const std::vector<float> values = (own ? p : opt.master_of(i)).to_vector();
      all.insert(all.end(), values.begin(), values.end());
    }
    return all;
  };

  Result result;
  int64_t zeros = 0, total = 0, unchanged = 0, updated = 0;
  struct CastTotals {
    int64_t numel = 0, saturated = 0, flushed = 0;
    void add(const ag::amp::Float8TensorStats& s) {
      numel += s.numel;
      saturated += s.saturated;
      flushed += s.flushed;
    }
    double share(int64_t count) const {
      return static_cast<double>(count) / static_cast<double>(std::max<int64_t>(numel, 1));
    }
  };
  // Per weight, in the model's order: its name, its forward's casts and its gradient's.
  std::vector<std::tuple<std::string, CastTotals, CastTotals>> fp8_casts;
  std::vector<double> magnitudes;
  for (int64_t step = 0; step < config.steps; ++step) {
    opt.zero_grad();
    ag::Tensor loss;
    {
      // With BF16 parameters autocast casts only the FP32 input to BF16.
      ag::amp::AutocastGuard autocast(dev, autocast_dtype, /*enabled=*/low);
      ag::amp::Float8Guard fp8(dev, {.scaling = fp8_scaling}, /*enabled=*/fp8_mode);
      loss = ag::ops::mse_loss(model(x), y) * static_cast<float>(config.loss_weight);
    }
    result.losses.push_back(loss.item() / config.loss_weight);
    result.scales.push_back(scaler.get_scale());
    scaler.scale(loss).backward();
    if (step == 0) {
      // The true gradients: the stored ones carry the scale.
      result.histogram = ag::amp::measure_grad_stats(model.named_parameters(), scaler.get_scale()).total().histogram;
    }
    // Gradients as the 16-bit backward produced them (still scaled): count exact zeros.
    for (const ag::Tensor& p : model.parameters()) {
      for (float g : p.grad().to_vector()) {
        zeros += g == 0.0f;
        ++total;
        if (!low && step == 0) magnitudes.push_back(std::fabs(g));
      }
    }
    if (fp8_mode) {
      const std::vector<ag::amp::Float8TensorStats> stats = ag::amp::float8_stats(model.named_parameters());
      for (const ag::amp::Float8TensorStats& s : stats) {
        const bool grad = s.role == ag::amp::Float8Role::kGradOutput;
        auto it = std::find_if(fp8_casts.begin(), fp8_casts.end(),
                               [&](const auto& c) { return std::get<0>(c) == s.name; });
        if (it == fp8_casts.end()) it = fp8_casts.insert(it, {s.name, {}, {}});
        (grad ? std::get<2>(*it) : std::get<1>(*it)).add(s);
        if (grad && s.name == stats.back().name) {  // the output layer
          result.fp8_grad_amax.push_back(s.amax);
          result.fp8_grad_scale.push_back(s.scale);
        }
      }
    }
    const std::vector<float> before = stored_weights();
    if (!scaler.step(opt)) {
      ++result.skipped_steps;
      result.skipped.push_back(step);
    }
    const std::vector<float> after = stored_weights();
    for (size_t j = 0; j < after.size(); ++j) unchanged += after[j] == before[j];
    updated += static_cast<int64_t>(after.size());
    if (const ag::amp::GradStatsReport* stats = scaler.grad_stats(); stats != nullptr && stats->iteration == step) {
      result.recommended = ag::amp::recommend_scale(stats->total().histogram);
      result.scale_at_recommendation = stats->scale;
    }
    const double scale_before = scaler.get_scale();
    scaler.update();
    result.scale_growths += scaler.get_scale() > scale_before ? 1 : 0;
  }
  {
    // In FP32 for every mode (BF16 parameters widen exactly), so the rounding of a BF16 forward
    // does not blur the comparison.
    ag::NoGradGuard no_grad;
    if (bf16_params) model.to(ag::DType::kFloat32);
    result.final_loss = ag::ops::mse_loss(model(x), y).item();
  }
  result.zero_grad_fraction = static_cast<double>(zeros) / static_cast<double>(std::max<int64_t>(total, 1));
  if (!magnitudes.empty()) {
    std::nth_element(magnitudes.begin(), magnitudes.begin() + magnitudes.size() / 2, magnitudes.end());
    result.median_abs_fp32_grad = magnitudes[magnitudes.size() / 2];
  }
  result.final_scale = scaled ? scaler.get_scale() : 1.0;
  result.lost_update_fraction = static_cast<double>(unchanged) / static_cast<double>(std::max<int64_t>(updated, 1));
  for (const auto& [name, forward, gradient] : fp8_casts) {
    result.fp8_casts.push_back({.weight = name,
                                .forward_saturated = forward.share(forward.saturated),
                                .forward_flushed = forward.share(forward.flushed),
                                .grad_saturated = gradient.share(gradient.saturated),
                                .grad_flushed = gradient.share(gradient.flushed)});
  }
  return result;
}

std::vector<Mode> all_modes() {
  return {Mode::kFp32,          Mode::kFp16NoScaling,        Mode::kFp16StaticScale,   Mode::kFp16DynamicScale,
          Mode::kBf16NoScaling, Mode::kBf16ParamsNoMasters, Mode::kBf16ParamsMasters, Mode::kBf16ParamsStochastic,
          Mode::kFp8NoScaling,  Mode::kFp8CurrentScaling,  Mode::kFp8DelayedScaling};
}

std::vector<std::string> write_plots(const std::vector<std::pair<Mode, Result>>& runs, const std::string& dir) {
  namespace utils = ag::utils;
  std::filesystem::create_directories(dir);
  std::vector<std::string> paths;
  const auto steps_of = [](size_t n) {
    std::vector<double> xs(n);
    for (size_t i = 0; i < n; ++i) xs[i] = static_cast<double>(i);
    return xs;
  };

  utils::Chart loss{.title = "training loss: FP32, FP16 with and without loss scaling, BF16, FP8 with and without scaling",
                    .xlabel = "step",
                    .ylabel = "MSE (log scale)",
                    .log_y = true};
  // gnuplot's default palette has eight colours; the last rows get their own.
  const auto color_of = [](Mode mode) -> std::string {
    switch (mode) {
      case Mode::kFp8NoScaling: return "#7f7f7f";
      case Mode::kFp8CurrentScaling: return "#c51b7d";
      case Mode::kFp8DelayedScaling: return "#8c510a";
      case Mode::kBf16ParamsStochastic: return "#1b9e77";
      default: return "";
    }
  };
  for (const auto& [mode, r] : runs) {
    loss.series.push_back(
        {.name = mode_name(mode), .x = steps_of(r.losses.size()), .y = r.losses, .color = color_of(mode)});
  }
  paths.push_back((std::filesystem::path(dir) / "loss.png").string());
  utils::plot_png(loss, paths.back());

  const Result* dynamic = nullptr;
  for (const auto& [mode, r] : runs) {
    if (mode == Mode::kFp16DynamicScale) dynamic = &r;
  }
  if (dynamic != nullptr) {
    utils::Chart scale{.title = "dynamic loss scale (GradScaler)",
                       .xlabel = "step",
                       .ylabel = "loss scale (log scale)",
                       .log_y = true};
    scale.series.push_back({.name = "scale", .x = steps_of(dynamic->scales.size()), .y = dynamic->scales,
                            .style = utils::SeriesStyle::kSteps});
    utils::Series skipped{.name = "skipped step", .style = utils::SeriesStyle::kPoints};
    for (int64_t s : dynamic->skipped) {
      skipped.x.push_back(static_cast<double>(s));
      skipped.y.push_back(dynamic->scales[static_cast<size_t>(s)]);
    }
    // gnuplot cannot draw an empty series: say "none" in the title instead.
    if (skipped.x.empty()) {
      scale.title += ", no skipped step";
    } else {
      scale.series.push_back(skipped);
    }
    paths.push_back((std::filesystem::path(dir) / "scale.png").string());
    utils::plot_png(scale, paths.back());

    // Exponents of the true gradients, and where the final scale moves them.
    const ag::amp::ExponentHistogram& h = dynamic->histogram;
    const int shift = static_cast<int>(std::lround(std::log2(dynamic->final_scale)));
    utils::Series truth{.name = "true gradients (step 0)", .style = utils::SeriesStyle::kBoxes};
    utils::Series scaled{.name = "times the final scale 2^" + std::to_string(shift),
                         .style = utils::SeriesStyle::kBoxes};
    for (int e = h.min_exponent(); e <= h.max_exponent(); ++e) {
      if (h.count(e) == 0) continue;
      truth.x.push_back(e + 0.5);
      truth.y.push_back(static_cast<double>(h.count(e)));
      scaled.x.push_back(e + shift + 0.5);
      scaled.y.push_back(static_cast<double>(h.count(e)));
    }
    if (!truth.x.empty()) {
      const double lo = std::min(-30.0, truth.x.front() - 2), hi = std::max(18.0, scaled.x.back() + 2);
      utils::Chart exponents{.title = "gradient exponents against FP16's ranges",
                             .xlabel = "log2 |gradient|",
                             .ylabel = "values",
                             .series = {truth, scaled},
                             .shaded = {{.from = lo, .to = -24, .label = "flushed to 0", .color = "#f4cccc"},
                                        {.from = -24, .to = -14, .label = "subnormal", .color = "#fff2cc"},
                                        {.from = -14, .to = 16, .label = "normal", .color = "#d9ead3"},
                                        {.from = 16, .to = hi, .label = "overflow", .color = "#f4cccc"}},
                             .x_range = std::pair{lo, hi},
                             .width = 900,
                             .height = 400};
      paths.push_back((std::filesystem::path(dir) / "grad_exponents.png").string());
      utils::plot_png(exponents, paths.back());
    }
  }
  // Where each FP8 mode's scale puts the output layer's gradient in E5M2: unscaled, its largest
  // value sits below the flush line and every gradient is lost; current scaling puts it at the
  // top; delayed scaling at the top of its amax window (here: the first steps' larger gradients).
  utils::Chart fp8{.title = "FP8: the output layer's largest gradient as cast (amax x scale) against E5M2's range",
                   .xlabel = "step",
                   .ylabel = "amax x scale (log scale)",
                   .log_y = true};
  std::vector<utils::Series> modes;
  for (const auto& [mode, r] : runs) {
    if (r.fp8_grad_amax.empty()) continue;
    utils::Series scaled{.name = mode_name(mode), .x = steps_of(r.fp8_grad_amax.size()), .color = color_of(mode)};
    for (size_t i = 0; i < r.fp8_grad_amax.size(); ++i) scaled.y.push_back(r.fp8_grad_amax[i] * r.fp8_grad_scale[i]);
    modes.push_back(std::move(scaled));
  }
  if (!modes.empty()) {
    // The format's levels first, so that the modes' curves are drawn over them.
    const std::vector<double> ends{modes.front().x.front(), modes.front().x.back()};
    const auto level = [&](const std::string& name, double y, const std::string& color) {
      fp8.series.push_back({.name = name, .x = ends, .y = {y, y}, .color = color});
    };
    level("E5M2's largest (57344)", 57344.0, "#000000");
    level("E5M2's smallest normal (2^-14)", std::ldexp(1.0, -14), "#2ca02c");
    level("flushed to 0 below (2^-17)", std::ldexp(1.0, -17), "#d62728");
    for (utils::Series& series : modes) fp8.series.push_back(std::move(series));
    paths.push_back((std::filesystem::path(dir) / "fp8_grad_scale.png").string());
    utils::plot_png(fp8, paths.back());
  }
  return paths;
}

}  // namespace underflow
