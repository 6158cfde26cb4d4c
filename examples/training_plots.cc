// Loss and loss-scale charts for the training examples.
#include "examples/training_plots.h"

#include <filesystem>

#include "ampgrad.h"

namespace training_plots {

namespace utils = ampgrad::utils;

std::vector<int64_t> scale_drops(const Curves& curves) {
  std::vector<int64_t> steps;
  for (size_t i = 1; i < curves.scale.size(); ++i) {
    if (curves.scale[i] < curves.scale[i - 1]) steps.push_back(curves.first_step + static_cast<int64_t>(i));
  }
  return steps;
}

std::vector<std::string> write(const Curves& curves, const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::vector<std::string> paths;
  std::vector<double> steps(curves.train_loss.size());
  for (size_t i = 0; i < steps.size(); ++i) steps[i] = static_cast<double>(curves.first_step + static_cast<int64_t>(i));

  utils::Chart loss{.title = curves.title + ": loss", .xlabel = "step", .ylabel = "loss (log scale)", .log_y = true};
  loss.series.push_back({.name = "train", .x = steps, .y = curves.train_loss});
  if (!curves.val_loss.empty()) {
    utils::Series val{.name = "validation", .style = utils::SeriesStyle::kLinesPoints};
    for (const auto& [step, value] : curves.val_loss) {
      val.x.push_back(static_cast<double>(step));
      val.y.push_back(value);
    }
    loss.series.push_back(val);
  }
  paths.push_back((std::filesystem::path(dir) / "loss.png").string());
  utils::plot_png(loss, paths.back());

  if (!curves.scale.empty()) {
    utils::Chart scale{.title = curves.title + ": loss scale", .xlabel = "step", .ylabel = "scale (log scale)",
                       .log_y = true};
    scale.series.push_back({.name = "scale", .x = steps, .y = curves.scale, .style = utils::SeriesStyle::kSteps});
    utils::Series skipped{.name = "skipped step", .style = utils::SeriesStyle::kPoints};
    for (int64_t s : scale_drops(curves)) {
      skipped.x.push_back(static_cast<double>(s));
      skipped.y.push_back(curves.scale[static_cast<size_t>(s - curves.first_step)]);
    }
    if (skipped.x.empty()) {
      scale.title += " (no skipped step)";
    } else {
      scale.series.push_back(skipped);
    }
    paths.push_back((std::filesystem::path(dir) / "scale.png").string());
    utils::plot_png(scale, paths.back());
  }
  return paths;
}

}  // namespace training_plots
