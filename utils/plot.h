// Charts as PNG files, drawn by gnuplot (Debian's gnuplot-nox, which ./bazelw installs).
//   utils::plot_png({.title = "loss", .log_y = true, .series = {{.name = "fp16", .x = xs, .y = ys}}}, "loss.png");
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ampgrad::utils {

/// How a series is drawn: gnuplot's lines, points, linespoints, steps or boxes.
enum class SeriesStyle { kLines, kPoints, kLinesPoints, kSteps, kBoxes };
/// Which y axis a series is drawn against: left (ylabel) or right (y2label), e.g. loss and loss scale.
enum class Axis { kLeft, kRight };

/// One curve: points (x[i], y[i]); inf/NaN values leave a gap.
struct Series {
  std::string name{};  ///< legend entry
  std::vector<double> x{};                  ///< the abscissae
  std::vector<double> y{};                  ///< the values, one per x
  SeriesStyle style = SeriesStyle::kLines;  ///< how it is drawn
  Axis axis = Axis::kLeft;                  ///< which y axis it is read against
  std::string color{};                      ///< any gnuplot colour ("#rrggbb" or a name); empty: gnuplot's next
};

/// A labelled band behind the curves, e.g. FP16's subnormal range of exponents.
struct ShadedRange {
  double from = 0;      ///< where the band starts on the x axis
  double to = 0;        ///< and where it ends
  std::string label{};  ///< written inside the band
  std::string color = "#e0e0e0";  ///< any gnuplot colour: "#rrggbb" or a name
};

/// A chart plot_png draws: curves against one or two y axes, bands behind them.
struct Chart {
  std::string title{};    ///< above the chart
  std::string xlabel{};   ///< the x axis' label
  std::string ylabel{};   ///< the left y axis' label
  std::string y2label{};  ///< the right y axis' label (series with Axis::kRight)
  bool log_x = false;     ///< a logarithmic x axis
  bool log_y = false;     ///< a logarithmic left y axis
  bool log_y2 = false;    ///< a logarithmic right y axis
  std::vector<Series> series{};       ///< the curves, in legend order
  std::vector<ShadedRange> shaded{};  ///< the bands behind them
  std::optional<std::pair<double, double>> x_range{};  ///< [min, max] of x; autoscaled when absent
  std::optional<std::pair<double, double>> y_range{};  ///< [min, max] of the left y; autoscaled when absent
  int width = 800;   ///< pixels
  int height = 480;  ///< pixels
};

/// Whether a `gnuplot` executable is on PATH.
bool gnuplot_available();

/// Draws `chart` into the PNG file `path` (overwritten). The data and script go to a private temporary
/// folder; gnuplot runs without a shell and every text is passed as a quoted gnuplot string, so
/// titles and paths cannot inject commands. Throws ampgrad::Error for an invalid chart (no series,
/// x and y of different lengths, a size out of 16..10000), a missing gnuplot, or a gnuplot failure
/// (with its messages and the output path).
void plot_png(const Chart& chart, const std::string& path);

/// The gnuplot script plot_png runs, reading the data from `data_path` (exposed for tests).
std::string gnuplot_script(const Chart& chart, const std::string& data_path, const std::string& png_path);

/// `text` as a single-quoted gnuplot string: quotes doubled, control characters made spaces.
std::string gnuplot_quote(const std::string& text);

}  // namespace ampgrad::utils
