// PNG charts through gnuplot (see plot.h).
#include "utils/plot.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <locale>
#include <sstream>

#include "framework/error.h"

extern char** environ;

namespace ampgrad::utils {

namespace {

namespace fs = std::filesystem;

const char* style_name(SeriesStyle style) {
  switch (style) {
    case SeriesStyle::kLines: return "lines";
    case SeriesStyle::kPoints: return "points";
    case SeriesStyle::kLinesPoints: return "linespoints";
    case SeriesStyle::kSteps: return "steps";
    case SeriesStyle::kBoxes: return "boxes";
  }
  return "lines";
}

// A number gnuplot reads back exactly, independent of the C++ locale; inf/NaN become gaps.
void put_number(std::ostream& out, double v) {
  if (std::isfinite(v)) out << v;
  else out << "NaN";
}

std::ostringstream classic_stream() {
  std::ostringstream out;
  out.imbue(std::locale::classic());
  out.precision(17);
  return out;
}

// A private folder for the data, script and gnuplot's messages, removed on every path out.
struct TempFolder {
  fs::path path;
  TempFolder() {
    std::string pattern = (fs::temp_directory_path() / "ampgrad-plot-XXXXXX").string();
    AG_CHECK(::mkdtemp(pattern.data()) != nullptr, "plot_png: cannot create a temporary folder ", pattern, ": ",
             std::strerror(errno));
    path = pattern;
  }
  ~TempFolder() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  AG_CHECK(out.good(), "plot_png: cannot write ", path.string());
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Runs `gnuplot -d script` (-d: ignore the user's ~/.gnuplot) with stdin from /dev/null and its
// output in `log`; returns the wait status.
int run_gnuplot(const fs::path& script, const fs::path& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  std::string arg0 = "gnuplot", arg1 = "-d", arg2 = script.string();
  char* argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, "gnuplot", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  AG_CHECK(rc == 0, "plot_png: cannot start gnuplot: ", std::strerror(rc),
           "; hint: install gnuplot-nox (./bazelw installs it)");
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    AG_CHECK(errno == EINTR, "plot_png: waiting for gnuplot failed: ", std::strerror(errno));
  }
  return status;
}

}  // namespace

std::string gnuplot_quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') out += "''";  // inside '...' gnuplot reads '' as one quote and nothing else as special
    else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) out += ' ';
    else out += c;
  }
  return out + "'";
}

bool gnuplot_available() {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');)
    if (!dir.empty() && ::access((fs::path(dir) / "gnuplot").c_str(), X_OK) == 0) return true;
  return false;
}

std::string gnuplot_script(const Chart& chart, const std::string& data_path, const std::string& png_path) {
  std::ostringstream s = classic_stream();
  // noenhanced: titles are plain text (no ^ _ @ markup), so user strings show as written.
  s << "set terminal pngcairo size " << chart.width << "," << chart.height << " noenhanced font ',10'\n";
  s << "set output " << gnuplot_quote(png_path) << "\n";
  s << "set title " << gnuplot_quote(chart.title) << "\n";
  s << "set xlabel " << gnuplot_quote(chart.xlabel) << "\n";
  s << "set ylabel " << gnuplot_quote(chart.ylabel) << "\n";
  // The band labels sit along the top, so with bands the legend goes below the chart to stay clear of them.
  s << "set grid\nset key " << (chart.shaded.empty() ? "top right" : "below") << "\n";
  if (chart.log_x) s << "set logscale x\n";
  if (chart.log_y) s << "set logscale y\n";
  bool right = false;
  for (const Series& series : chart.series) right |= series.axis == Axis::kRight;
  if (right) {
    s << "set y2label " << gnuplot_quote(chart.y2label) << "\nset y2tics\nset ytics nomirror\n";
    if (chart.log_y2) s << "set logscale y2\n";
  }
  if (chart.x_range) s << "set xrange [" << chart.x_range->first << ":" << chart.x_range->second << "]\n";
  if (chart.y_range) s << "set yrange [" << chart.y_range->first << ":" << chart.y_range->second << "]\n";
  for (size_t i = 0; i < chart.shaded.size(); ++i) {
    const ShadedRange& r = chart.shaded[i];
    s << "set object " << i + 1 << " rect from first " << r.from << ", graph 0 to first " << r.to
      << ", graph 1 behind fillcolor rgb " << gnuplot_quote(r.color) << " fillstyle solid 1.0 noborder\n";
    // The label sits near the top, centred on the band (its geometric centre on a log axis).
    const double mid = chart.log_x && r.from > 0 && r.to > 0 ? std::sqrt(r.from * r.to) : (r.from + r.to) / 2;
    s << "set label " << i + 1 << " " << gnuplot_quote(r.label) << " at first " << mid << ", graph 0.96 center front\n";
  }
  s << "plot ";
  for (size_t i = 0; i < chart.series.size(); ++i) {
    const Series& series = chart.series[i];
    s << (i ? ", \\\n     " : "") << gnuplot_quote(data_path) << " index " << i << " using 1:2 with "
      << style_name(series.style) << (series.style == SeriesStyle::kBoxes ? " fillstyle solid 0.5" : "")
      << " linewidth 2"
      << (series.color.empty() ? "" : " linecolor rgb " + gnuplot_quote(series.color))
      << " axes " << (series.axis == Axis::kRight ? "x1y2" : "x1y1") << " title " << gnuplot_quote(series.name);
  }
  s << "\n";
  return s.str();
}

void plot_png(const Chart& chart, const std::string& path) {
  AG_CHECK(!path.empty(), "plot_png: empty output path");
  AG_CHECK(!chart.series.empty(), "plot_png(", path, "): the chart '", chart.title, "' has no series");
  AG_CHECK(chart.width >= 16 && chart.width <= 10000 && chart.height >= 16 && chart.height <= 10000, "plot_png(",
           path, "): size ", chart.width, "x", chart.height, " is outside 16..10000 pixels");
  for (const Series& series : chart.series)
    AG_CHECK(!series.x.empty() && series.x.size() == series.y.size(), "plot_png(", path, "): series '", series.name,
             "' has ", series.x.size(), " x values and ", series.y.size(), " y values; hint: give as many of each, ",
             "at least one");
  AG_CHECK(gnuplot_available(), "plot_png(", path, "): gnuplot is not on PATH; hint: install gnuplot-nox ",
           "(./bazelw installs it)");

  TempFolder temp;
  std::ostringstream data = classic_stream();
  for (const Series& series : chart.series) {  // one block per series, two blank lines apart (gnuplot's `index`)
    for (size_t i = 0; i < series.x.size(); ++i) {
      put_number(data, series.x[i]);
      data << ' ';
      put_number(data, series.y[i]);
      data << '\n';
    }
    data << "\n\n";
  }
  write_file(temp.path / "data.txt", data.str());
  const fs::path script = temp.path / "chart.gp", log = temp.path / "gnuplot.log";
  write_file(script, gnuplot_script(chart, (temp.path / "data.txt").string(), path));

  const int status = run_gnuplot(script, log);
  const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  AG_CHECK(ok, "plot_png(", path, "): gnuplot failed (",
           WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                             : "signal " + std::to_string(WTERMSIG(status)),
           "): ", read_file(log));
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  AG_CHECK(!ec && size > 0, "plot_png(", path, "): gnuplot exited cleanly but wrote no image");
}

}  // namespace ampgrad::utils
