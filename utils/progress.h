// A training progress line: "step 120/1000  loss 1.2345  scale 65536  12.3 steps/s  ETA 1m12s".
// On a terminal it rewrites itself with '\r'; into a file or pipe it prints plain lines, rate-limited.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

namespace ampgrad::utils {

/// kAuto: kTerminal when the stream is std::cout, std::cerr or std::clog and that descriptor is a tty.
enum class ProgressMode { kAuto, kTerminal, kLines };

/// How and how often a ProgressLine shows itself.
struct ProgressOptions {
  ProgressMode mode = ProgressMode::kAuto;  ///< rewrite one terminal line, or print lines
  int64_t every_steps = 1;          ///< kLines: a line needs at least this many steps since the last one ...
  double every_seconds = 10;        ///< ... and at least this many seconds (the first and last step always print)
  double redraw_seconds = 0.1;      ///< kTerminal: redraw at most this often
  int64_t start_step = 0;           ///< the step the run starts from (a resumed run), for steps/s and the ETA
  std::function<double()> clock{};  ///< seconds on a monotonic clock; steady_clock when empty (tests inject one)
};

/// Fields shown after the step count, in order: {{"loss", 1.2345}, {"scale", 65536}}.
using ProgressFields = std::vector<std::pair<std::string, double>>;

/// A progress line: step/total, the caller's fields, steps per second and the ETA, rewritten in
/// place on a terminal or printed as rate-limited lines into a log.
class ProgressLine {
 public:
  /// total_steps <= 0: unknown (no "/total" and no ETA).
  explicit ProgressLine(int64_t total_steps, std::ostream& out, ProgressOptions options = {});
  ~ProgressLine();  // finish()
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  /// `step` steps are done; shows the line if the mode's rate limit allows (the last step always).
  void update(int64_t step, const ProgressFields& fields = {});
  /// Shows `step` now, whatever the rate limit, and keeps the line (a terminal moves on to a new
  /// one): for steps worth a record, such as an evaluation.
  void keep(int64_t step, const ProgressFields& fields = {});
  /// On a terminal, ends the rewritten line with '\n' (done by itself at the last step).
  void finish();
  /// Whether the line is rewritten in place (kTerminal, or kAuto on a tty).
  bool is_terminal() const { return terminal_; }

  /// The line for `step` at time `now` (seconds on the options' clock), without a carriage return
  /// or newline.
  std::string format(int64_t step, const ProgressFields& fields, double now) const;

 private:
  double now() const;
  void show_line(int64_t step, const ProgressFields& fields, double t);
  int64_t total_;
  std::ostream& out_;
  ProgressOptions options_;
  bool terminal_;
  double start_time_;
  bool shown_any_ = false;
  int64_t last_step_ = 0;
  double last_time_ = 0;
  size_t last_width_ = 0;  // terminal: the previous line's length, blanked when the new one is shorter
  bool line_open_ = false; // terminal: a line is drawn without its '\n'
};

/// A duration as "45s", "1m05s", "2h03m" or "3d04h" (rounded to the shown unit); "?" if negative or not finite.
std::string format_duration(double seconds);

/// A field value: integers up to 1e15 in full ("65536"), others with 5 significant digits ("1.2345").
std::string format_value(double value);

}  // namespace ampgrad::utils
