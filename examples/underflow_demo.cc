// Why loss scaling matters for FP16 and master weights for BF16, made visible: the same training
// run in FP32; in FP16 autocast without scaling, with a static scale and with the dynamic
// GradScaler; in BF16 autocast without scaling; with BF16 parameters without masters, with FP32
// masters and rounded stochastically without masters; and with linear's GEMMs in FP8 without
// scaling, with current scaling and with delayed scaling.
//   underflow_demo [--plot DIR]   DIR: loss.png, scale.png, grad_exponents.png, fp8_grad_scale.png
//                                 (needs gnuplot)
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "examples/underflow.h"

int main(int argc, char** argv) {
  using underflow::Mode;
  std::string plot_dir;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--plot") == 0 && i + 1 < argc) {
      plot_dir = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--plot DIR]\n", argv[0]);
      return 2;
    }
  }
  if (!plot_dir.empty() && !ampgrad::utils::gnuplot_available()) {
    std::fprintf(stderr, "--plot needs gnuplot (Debian: gnuplot-nox), which is not on PATH\n");
    return 1;
  }
  underflow::Config config;
  std::printf("Teacher-student MLP 32-64-1, Adam lr 1e-3, %lld steps, loss weighted by %.0e\n",
              static_cast<long long>(config.steps), config.loss_weight);
  std::printf("dynamic GradScaler: init_scale 65536, growth_interval %lld\n",
              static_cast<long long>(config.dynamic_growth_interval));
  std::vector<std::pair<Mode, underflow::Result>> runs;
  for (Mode mode : underflow::all_modes()) runs.emplace_back(mode, underflow::train(mode, config));
  std::printf("median |true gradient| at step 0: %.2e (FP16's smallest subnormal is 6.0e-08)\n\n",
              runs.front().second.median_abs_fp32_grad);
  std::printf("%-33s %12s %12s %10s %8s %13s %13s\n", "mode", "final loss", "zero grads", "skipped", "growths",
              "final scale", "lost updates");
  const underflow::Result* dynamic = nullptr;
  for (const auto& [mode, r] : runs) {
    std::printf("%-33s %12.4e %11.1f%% %10lld %8lld %13.0f %12.1f%%\n", underflow::mode_name(mode).c_str(),
                r.final_loss, 100.0 * r.zero_grad_fraction, static_cast<long long>(r.skipped_steps),
                static_cast<long long>(r.scale_growths), r.final_scale, 100.0 * r.lost_update_fraction);
    if (mode == Mode::kFp16DynamicScale) dynamic = &r;
  }
  std::printf("\nFP8 casts over all steps (amp::float8_stats), shares of the values each linear cast:\n");
  std::printf("%-24s %-9s %14s %14s %14s %14s\n", "mode", "weight", "in+w satur.", "in+w flushed", "grad satur.",
              "grad flushed");
  for (const auto& [mode, r] : runs) {
    for (const underflow::Result::Float8Casts& c : r.fp8_casts) {
      std::printf("%-24s %-9s %13.4g%% %13.4g%% %13.4g%% %13.4g%%\n", underflow::mode_name(mode).c_str(),
                  c.weight.c_str(), 100.0 * c.forward_saturated, 100.0 * c.forward_flushed,
                  100.0 * c.grad_saturated, 100.0 * c.grad_flushed);
    }
  }
  if (dynamic != nullptr && !dynamic->recommended.empty) {
    std::printf("\ngradient statistics (every %lld steps): recommended scale %s (%.2f%% of values underflow "
                "there), GradScaler's scale %s\n",
                static_cast<long long>(config.stats_every),
                ampgrad::amp::format_scale(dynamic->recommended.scale).c_str(),
                100.0 * dynamic->recommended.underflow_fraction,
                ampgrad::amp::format_scale(dynamic->scale_at_recommendation).c_str());
  }
  if (!plot_dir.empty()) {
    for (const std::string& path : underflow::write_plots(runs, plot_dir)) std::printf("wrote %s\n", path.c_str());
  }
  return 0;
}
