// The training examples' --plot: real PNGs of the expected size from a run's curves, and the
// skipped steps read off the scale (skips when gnuplot is absent).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "ampgrad.h"
#include "examples/training_plots.h"
#include "test_util.h"

namespace {

training_plots::Curves amp_run() {
  training_plots::Curves c{.title = "test run", .first_step = 10};
  double scale = 65536;
  for (int i = 0; i < 50; ++i) {
    c.train_loss.push_back(2.0 * std::exp(-0.05 * i));
    if (i == 7 || i == 30) scale /= 2;  // two skipped steps
    if (i == 40) scale *= 2;            // a growth
    c.scale.push_back(scale);
  }
  c.val_loss = {{10, 2.1}, {35, 0.5}, {59, 0.2}};
  return c;
}

TEST(TrainingPlots, ScaleDropsAreTheSkippedSteps) {
  EXPECT_EQ(training_plots::scale_drops(amp_run()), (std::vector<int64_t>{17, 40}));
  EXPECT_TRUE(training_plots::scale_drops({}).empty());
}

TEST(TrainingPlots, WritesLossAndScalePngs) {
  if (!ampgrad::utils::gnuplot_available()) GTEST_SKIP() << "gnuplot is not installed (Debian: gnuplot-nox)";
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("training_plots_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::vector<std::string> paths = training_plots::write(amp_run(), (dir / "amp").string());
  ASSERT_EQ(paths.size(), 2u);
  EXPECT_EQ(std::filesystem::path(paths[0]).filename(), "loss.png");
  EXPECT_EQ(std::filesystem::path(paths[1]).filename(), "scale.png");
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    EXPECT_GT(std::filesystem::file_size(path), 1000u);
    EXPECT_EQ(ampgrad::test::png_size(path), (std::pair<uint32_t, uint32_t>{800, 480}));
  }
  // Without AMP: the loss only.
  training_plots::Curves fp32 = amp_run();
  fp32.scale.clear();
  EXPECT_EQ(training_plots::write(fp32, (dir / "fp32").string()).size(), 1u);
  std::filesystem::remove_all(dir);
}

}  // namespace
