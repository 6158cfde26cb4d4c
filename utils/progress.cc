// ProgressLine (see progress.h).
#include "utils/progress.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "framework/error.h"

namespace ampgrad::utils {

namespace {

bool stream_is_terminal(const std::ostream& out) {
  if (&out == &std::cout) return ::isatty(STDOUT_FILENO) == 1;
  if (&out == &std::cerr || &out == &std::clog) return ::isatty(STDERR_FILENO) == 1;
  return false;  // a file, a string stream, ...: no descriptor to ask
}

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  char text[48];
  if (s < 60) std::snprintf(text, sizeof(text), "%llds", static_cast<long long>(s));
  else if (s < 3600) std::snprintf(text, sizeof(text), "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  else if (s < 86400) {
    const int64_t m = (s + 30) / 60;  // rounded to the minute, so 1h59m45s shows 2h00m
    std::snprintf(text, sizeof(text), "%lldh%02lldm", static_cast<long long>(m / 60), static_cast<long long>(m % 60));
  } else {
    const int64_t h = (s + 1800) / 3600;
    std::snprintf(text, sizeof(text), "%lldd%02lldh", static_cast<long long>(h / 24), static_cast<long long>(h % 24));
  }
  return text;
}

std::string format_value(double value) {
  char text[48];
  if (std::isfinite(value) && value == std::trunc(value) && std::fabs(value) < 1e15)
    std::snprintf(text, sizeof(text), "%.0f", value);
  else std::snprintf(text, sizeof(text), "%.5g", value);
  return text;
}

ProgressLine::ProgressLine(int64_t total_steps, std::ostream& out, ProgressOptions options)
    : total_(total_steps), out_(out), options_(std::move(options)) {
  AG_CHECK(options_.every_steps >= 1 && options_.every_seconds >= 0 && options_.redraw_seconds >= 0,
           "ProgressLine: every_steps must be >= 1 and every_seconds, redraw_seconds >= 0, got ",
           options_.every_steps, ", ", options_.every_seconds, ", ", options_.redraw_seconds);
  terminal_ = options_.mode == ProgressMode::kTerminal ||
              (options_.mode == ProgressMode::kAuto && stream_is_terminal(out_));
  start_time_ = now();
}

ProgressLine::~ProgressLine() {
  try {
    finish();
  } catch (...) {  // a stream set to throw must not end the program from a destructor
  }
}

double ProgressLine::now() const {
  if (options_.clock) return options_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string ProgressLine::format(int64_t step, const ProgressFields& fields, double now) const {
  std::string line = "step " + std::to_string(step);
  if (total_ > 0) line += "/" + std::to_string(total_);
  for (const auto& [name, value] : fields) line += "  " + name + " " + format_value(value);
  const double elapsed = now - start_time_;
  const int64_t done = step - options_.start_step;
  if (elapsed > 0 && done > 0) {  // before that there is no rate to show
    const double rate = done / elapsed;
    char text[48];
    std::snprintf(text, sizeof(text), rate >= 100 ? "%.0f" : "%.3g", rate);
    line += "  " + std::string(text) + " steps/s";
    if (total_ > 0) line += "  ETA " + format_duration(std::max<int64_t>(total_ - step, 0) / rate);
  }
  return line;
}

void ProgressLine::update(int64_t step, const ProgressFields& fields) {
  const double t = now();
  bool show = !shown_any_ || (total_ > 0 && step >= total_);
  if (terminal_) show = show || t - last_time_ >= options_.redraw_seconds;
  else show = show || (step - last_step_ >= options_.every_steps && t - last_time_ >= options_.every_seconds);
  if (show) show_line(step, fields, t);
}

void ProgressLine::keep(int64_t step, const ProgressFields& fields) {
  show_line(step, fields, now());
  finish();
}

void ProgressLine::show_line(int64_t step, const ProgressFields& fields, double t) {
  const bool last = total_ > 0 && step >= total_;

  const std::string line = format(step, fields, t);
  if (terminal_) {
    // '\r' returns to the start of the line; spaces blank what a longer previous line left behind.
    out_ << '\r' << line << std::string(last_width_ > line.size() ? last_width_ - line.size() : 0, ' ');
    last_width_ = line.size();
    line_open_ = true;
    if (last) finish();
    else out_.flush();
  } else {
    out_ << line << '\n';
    out_.flush();
  }
  shown_any_ = true;
  last_step_ = step;
  last_time_ = t;
}

void ProgressLine::finish() {
  if (!line_open_) return;
  out_ << '\n';
  out_.flush();
  line_open_ = false;
  last_width_ = 0;
}

}  // namespace ampgrad::utils
