// plot_png: real PNGs from gnuplot (signature and IHDR size checked), quoting that defeats injection,
// and clear errors for bad charts and gnuplot failures. Skips the drawing tests without gnuplot.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "utils/plot.h"

namespace ampgrad::utils {
namespace {

namespace fs = std::filesystem;

struct PngInfo {
  bool signature_ok = false;
  uint32_t width = 0, height = 0;
};

// A PNG starts with an 8-byte signature, then the IHDR chunk: length(4) "IHDR" width(4, big-endian) height(4).
PngInfo read_png_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string head((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  PngInfo info;
  if (head.size() < 24) return info;
  info.signature_ok = head.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0 && head.compare(12, 4, "IHDR") == 0;
  auto be32 = [&](size_t pos) {
    uint32_t v = 0;
    for (size_t i = 0; i < 4; ++i) v = v << 8 | static_cast<uint8_t>(head[pos + i]);
    return v;
  };
  info.width = be32(16);
  info.height = be32(20);
  return info;
}

class PlotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("plot_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void require_gnuplot() {
    if (!gnuplot_available()) GTEST_SKIP() << "gnuplot is not on PATH (install gnuplot-nox; ./bazelw does)";
  }
  fs::path dir_;
};

Chart loss_chart() {
  Series fp32{.name = "fp32", .x = {}, .y = {}}, fp16{.name = "fp16, no scaling", .x = {}, .y = {}, .style = SeriesStyle::kLinesPoints};
  for (int i = 0; i < 50; ++i) {
    fp32.x.push_back(i), fp32.y.push_back(std::exp(-0.1 * i));
    fp16.x.push_back(i), fp16.y.push_back(i == 20 ? NAN : 0.5 + std::exp(-0.1 * i));  // NaN: a gap, not an error
  }
  return {.title = "loss", .xlabel = "step", .ylabel = "loss", .log_y = true, .series = {fp32, fp16}, .width = 640, .height = 400};
}

TEST_F(PlotTest, WritesAPngOfTheRequestedSize) {
  require_gnuplot();
  const std::string path = (dir_ / "loss.png").string();
  plot_png(loss_chart(), path);
  const PngInfo png = read_png_header(path);
  EXPECT_TRUE(png.signature_ok);
  EXPECT_EQ(png.width, 640u);
  EXPECT_EQ(png.height, 400u);
}

TEST_F(PlotTest, DrawsShadedRangesAndASecondAxis) {
  require_gnuplot();
  // An exponent histogram against FP16's ranges, with a cumulative fraction on the right axis.
  Series counts{.name = "gradients", .x = {}, .y = {}, .style = SeriesStyle::kBoxes};
  Series cumulative{.name = "cumulative", .x = {}, .y = {}, .style = SeriesStyle::kSteps, .axis = Axis::kRight};
  double total = 0;
  for (int e = -40; e <= 20; ++e) {
    counts.x.push_back(e), counts.y.push_back(std::exp(-0.01 * (e + 10) * (e + 10)));
    total += counts.y.back();
    cumulative.x.push_back(e), cumulative.y.push_back(total);
  }
  const Chart chart{.title = "gradient exponents", .xlabel = "log2 |g|", .ylabel = "count", .y2label = "cumulative",
                    .series = {counts, cumulative},
                    .shaded = {{.from = -24, .to = -14, .label = "subnormal", .color = "#ffe0e0"},
                               {.from = -14, .to = 16, .label = "normal", .color = "#e0ffe0"},
                               {.from = 16, .to = 20, .label = "overflow", .color = "#e0e0ff"}},
                    .x_range = std::pair{-40.0, 20.0}, .width = 900, .height = 300};
  const std::string path = (dir_ / "exponents.png").string();
  plot_png(chart, path);
  const PngInfo png = read_png_header(path);
  EXPECT_TRUE(png.signature_ok);
  EXPECT_EQ(png.width, 900u);
  EXPECT_EQ(png.height, 300u);
}

TEST_F(PlotTest, TextCannotInjectGnuplotCommands) {
  require_gnuplot();
  const fs::path marker = dir_ / "injected";
  fs::remove(marker);
  const std::string attack = "x'; system('touch " + marker.string() + "'); print '";
  Chart chart = loss_chart();
  chart.title = attack + "\nset output '/dev/null'";  // a newline would start a new command if not removed
  chart.series[0].name = attack;
  chart.xlabel = "it's \"quoted\" \\ and `backticked`";
  const std::string path = (dir_ / "it's a chart.png").string();  // a quote in the output path too
  std::string error;
  try {
    plot_png(chart, path);
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_FALSE(fs::exists(marker)) << "a title ran a command";
  EXPECT_EQ(error, "");
  EXPECT_TRUE(read_png_header(path).signature_ok);
}

TEST_F(PlotTest, QuotesForGnuplot) {
  EXPECT_EQ(gnuplot_quote("plain"), "'plain'");
  EXPECT_EQ(gnuplot_quote("it's"), "'it''s'");
  EXPECT_EQ(gnuplot_quote("a\nb\tc"), "'a b c'");
  EXPECT_EQ(gnuplot_quote("\\n"), "'\\n'");  // backslashes are literal inside single quotes
  const std::string script = gnuplot_script(loss_chart(), "/tmp/d'ata", "/tmp/o.png");
  EXPECT_NE(script.find("'/tmp/d''ata' index 1 using 1:2 with linespoints"), std::string::npos) << script;
  EXPECT_NE(script.find("set logscale y\n"), std::string::npos);
  EXPECT_NE(script.find("noenhanced"), std::string::npos);
}

TEST_F(PlotTest, GnuplotFailureIsAnErrorNamingThePath) {
  require_gnuplot();
  const std::string path = (dir_ / "no_such_folder" / "x.png").string();
  EXPECT_TRUE(test::throws_error([&] { plot_png(loss_chart(), path); }, {"plot_png", path, "gnuplot failed", "cannot open"}));
  Chart bad_color = loss_chart();
  bad_color.shaded = {{.from = 0, .to = 1, .label = "x", .color = "not-a-colour"}};
  EXPECT_TRUE(test::throws_error([&] { plot_png(bad_color, (dir_ / "c.png").string()); }, {"gnuplot failed"}));
}

TEST_F(PlotTest, RejectsInvalidCharts) {
  // Checked before gnuplot runs, so these hold with or without it.
  Chart chart = loss_chart();
  chart.series.clear();
  EXPECT_TRUE(test::throws_error([&] { plot_png(chart, "x.png"); }, {"x.png", "no series"}));
  chart = loss_chart();
  chart.series[1].y.pop_back();
  EXPECT_TRUE(test::throws_error([&] { plot_png(chart, "x.png"); }, {"fp16, no scaling", "50 x values and 49 y values"}));
  chart = loss_chart();
  chart.width = 5;
  EXPECT_TRUE(test::throws_error([&] { plot_png(chart, "x.png"); }, {"5x400"}));
  EXPECT_TRUE(test::throws_error([&] { plot_png(loss_chart(), ""); }, {"empty output path"}));
}

}  // namespace
}  // namespace ampgrad::utils
