// TensorBoard event files, named and shaped like PyTorch's torch.utils.tensorboard.SummaryWriter:
//   ampgrad::utils::SummaryWriter writer("runs/amp");   // or SummaryWriter() for runs/<date>_<host>
//   writer.add_scalar("loss", loss.item(), step);  writer.add_histogram("grad/w", w.grad(), step);
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>

#include "framework/tensor.h"
#include "utils/event.h"
#include "utils/histogram.h"

namespace ampgrad::utils {

/// SummaryWriter's knobs, PyTorch's keyword arguments of the same names.
struct SummaryWriterOptions {
  std::string comment{};          ///< appended to the default folder name (unused when a folder is given)
  int max_queue = 10;             ///< events held in memory before they are written out
  double flush_secs = 120;        ///< pending events reach the file within this many seconds (0: at once)
  std::string filename_suffix{};  ///< appended to the event file's name
};

/// One event file at exactly `path` (created or truncated): the file_version event, then the events
/// given, TFRecord-framed. Pending events are written when max_queue are waiting, on flush(),
/// close() and destruction, and (as PyTorch's writer does) by a background thread every flush_secs
/// (with flush_secs 0, at once, and no thread). Write failures (unwritable folder, full disk) throw
/// ampgrad::Error naming the path; one the background thread meets is thrown by the next call.
/// The calls are safe from several threads.
class EventFileWriter {
 public:
  /// Creates (or truncates) the file at `path` and writes its file_version event.
  EventFileWriter(std::string path, int max_queue = 10, double flush_secs = 120);
  ~EventFileWriter();  // closes; an error there is printed to stderr, never thrown
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  /// Queues `event` (written at once when max_queue are waiting).
  void add_event(const Event& event);
  /// Writes every queued event to the file.
  void flush();
  void close();  ///< stops the thread, flushes and closes; later add_event calls throw; a second close() does nothing
  /// The file written.
  const std::string& path() const { return path_; }

 private:
  void flush_locked();           // mutex_ held
  void throw_deferred_locked();  // rethrows the background thread's write failure, once
  void flush_periodically();     // the background thread

  std::string path_;
  int fd_ = -1;
  int max_queue_;
  double flush_secs_;
  std::string pending_;  // framed records not yet written
  int pending_events_ = 0;
  std::mutex close_mutex_;  // one close() at a time
  std::mutex mutex_;        // guards everything above and below
  std::condition_variable wake_;
  bool stopping_ = false;
  std::string deferred_error_;
  std::thread flusher_;  // started last, joined first
};

/// Writes scalars and histograms for TensorBoard into one new event file per writer, named
/// events.out.tfevents.{unix seconds}.{hostname}.{pid}.{counter}{filename_suffix}, in `log_dir`
/// (created with its parents). An empty log_dir means PyTorch's default, default_log_dir(comment).
class SummaryWriter {
 public:
  /// Opens a new event file in `log_dir` (default_log_dir() when empty).
  explicit SummaryWriter(const std::string& log_dir = "", const SummaryWriterOptions& options = {});
  ~SummaryWriter();  // closes every file; never throws
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  /// One scalar (stored as a float, TensorBoard's simple_value). wall_time defaults to now, in
  /// seconds since the Unix epoch.
  void add_scalar(const std::string& tag, double value, int64_t step, std::optional<double> wall_time = std::nullopt);

  /// Several scalars on one chart, as PyTorch does it: each key k goes to its own event file in the
  /// subfolder {log_dir}/{main_tag, '/' replaced by '_'}_{k}, under the tag main_tag.
  void add_scalars(const std::string& main_tag, const std::map<std::string, double>& values, int64_t step,
                   std::optional<double> wall_time = std::nullopt);

  /// A histogram of `values`, bucketed as PyTorch's add_histogram does (see make_histogram; the
  /// default is PyTorch's bins="tensorflow").
  void add_histogram(const std::string& tag, std::span<const float> values, int64_t step,
                     HistogramBins bins = HistogramBins::tensorflow(), std::optional<double> wall_time = std::nullopt);
  /// The same for a tensor of any dtype or device (copied to the host as floats).
  void add_histogram(const std::string& tag, const Tensor& values, int64_t step,
                     HistogramBins bins = HistogramBins::tensorflow(), std::optional<double> wall_time = std::nullopt);

  /// A histogram bucketed by the caller (PyTorch's add_histogram_raw): bucket[i] counts the values
  /// in (bucket_limit[i-1], bucket_limit[i]]. Throws unless the two have the same nonzero length,
  /// the limits increase and the counts are >= 0 and sum to num.
  void add_histogram_raw(const std::string& tag, const Histogram& histogram, int64_t step,
                         std::optional<double> wall_time = std::nullopt);

  /// Writes every pending event of every file.
  void flush();
  void close();  ///< later add_* calls throw; a second close() does nothing
  /// The folder the event files are in.
  const std::string& get_logdir() const { return log_dir_; }
  /// The main event file (add_scalar, add_histogram).
  const std::string& file_path() const { return file_->path(); }

 private:
  void add_value(SummaryValue value, int64_t step, std::optional<double> wall_time);
  std::string log_dir_;
  SummaryWriterOptions options_;
  std::unique_ptr<EventFileWriter> file_;
  std::map<std::string, std::unique_ptr<EventFileWriter>> scalars_files_;  // add_scalars, by subfolder
  bool closed_ = false;
};

/// PyTorch's default folder: runs/{Mon}{DD}_{HH}-{MM}-{SS}_{hostname}{comment}, local time.
std::string default_log_dir(const std::string& comment = "");

/// Seconds since the Unix epoch, as a double (TensorBoard's wall_time).
double unix_time_now();

}  // namespace ampgrad::utils
