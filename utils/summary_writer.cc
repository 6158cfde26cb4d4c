// SummaryWriter and EventFileWriter (see summary_writer.h).
#include "utils/summary_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "framework/error.h"
#include "utils/tfrecord.h"

namespace ampgrad::utils {

namespace {

std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

std::string event_file_name(const std::string& suffix) {
  static std::atomic<int> counter{0};  // PyTorch's global uid: distinct names for files made in one second
  const auto seconds = static_cast<long long>(std::floor(unix_time_now()));
  char stamp[32];
  std::snprintf(stamp, sizeof(stamp), "%010lld", seconds);
  return "events.out.tfevents." + std::string(stamp) + "." + hostname() + "." + std::to_string(::getpid()) + "." +
         std::to_string(counter++) + suffix;
}

void create_folder(const std::string& folder) {
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  AG_CHECK(!ec, "SummaryWriter: cannot create the log folder ", folder, ": ", ec.message());
}

}  // namespace

double unix_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string default_log_dir(const std::string& comment) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%b%d_%H-%M-%S", &local);
  return "runs/" + std::string(stamp) + "_" + hostname() + comment;
}

// ---- EventFileWriter ----

EventFileWriter::EventFileWriter(std::string path, int max_queue, double flush_secs)
    : path_(std::move(path)), max_queue_(max_queue), flush_secs_(flush_secs) {
  AG_CHECK(max_queue >= 1 && flush_secs >= 0 && flush_secs < 1e9, "EventFileWriter(", path_,
           "): max_queue must be >= 1 and flush_secs in [0, 1e9), got max_queue ", max_queue, ", flush_secs ", flush_secs);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  AG_CHECK(fd_ >= 0, "SummaryWriter: cannot create the event file ", path_, ": ", std::strerror(errno));
  // As PyTorch does: the version event first, written at once, so an empty run still has a valid file.
  try {
    add_event({.wall_time = unix_time_now(), .step = 0, .file_version = "brain.Event:2", .values = {}});
    flush();
    if (flush_secs_ > 0) flusher_ = std::thread([this] { flush_periodically(); });
  } catch (...) {  // no destructor runs for a constructor that throws: release the descriptor here
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

EventFileWriter::~EventFileWriter() {
  try {
    close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampgrad: closing an event file failed: %s\n", e.what());
  }
}

void EventFileWriter::flush_periodically() {
  std::unique_lock<std::mutex> lock(mutex_);
  // At most a thousand wake-ups a second, however small flush_secs is.
  const auto period = std::chrono::duration<double>(std::max(flush_secs_, 1e-3));
  while (!wake_.wait_for(lock, period, [this] { return stopping_; })) {
    if (pending_events_ == 0 || !deferred_error_.empty()) continue;
    try {
      flush_locked();
    } catch (const std::exception& e) {
      deferred_error_ = e.what();
    }
  }
}

void EventFileWriter::throw_deferred_locked() {
  if (deferred_error_.empty()) return;
  const std::string error = std::move(deferred_error_);
  deferred_error_.clear();
  AG_FAIL(error, " (in the background flush)");
}

void EventFileWriter::add_event(const Event& event) {
  std::lock_guard<std::mutex> lock(mutex_);
  AG_CHECK(fd_ >= 0, "SummaryWriter: ", path_, " is closed; hint: no add_* call after close()");
  throw_deferred_locked();
  pending_ += tfrecord_frame(encode_event(event));
  ++pending_events_;
  if (pending_events_ >= max_queue_ || flush_secs_ == 0) flush_locked();
}

void EventFileWriter::flush() {
  std::lock_guard<std::mutex> lock(mutex_);
  throw_deferred_locked();
  flush_locked();
}

void EventFileWriter::flush_locked() {
  if (fd_ < 0) return;
  // Dropped even if the write fails, so no record is written twice. A write that fails part-way
  // leaves a truncated record, which readers (and read_events) report at that offset.
  const std::string bytes = std::move(pending_);
  pending_.clear();
  pending_events_ = 0;
  const char* p = bytes.data();
  size_t n = bytes.size();
  while (n > 0) {
    const ssize_t written = ::write(fd_, p, n);
    if (written < 0 && errno == EINTR) continue;
    AG_CHECK(written > 0, "SummaryWriter: writing ", path_, " failed: ", written < 0 ? std::strerror(errno) : "no progress");
    p += written;
    n -= static_cast<size_t>(written);
  }
}

void EventFileWriter::close() {
  // Serialises whole close() calls (two threads, or one and the destructor): the thread is joined
  // once. The thread itself takes only mutex_, which is not held while joining.
  std::lock_guard<std::mutex> closing(close_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (flusher_.joinable()) flusher_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0) return;
  try {
    throw_deferred_locked();
    flush_locked();
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
  const int rc = ::close(fd_);  // some file systems (NFS, quotas) report write errors only here
  fd_ = -1;
  AG_CHECK(rc == 0, "SummaryWriter: closing ", path_, " failed: ", std::strerror(errno));
}

// ---- SummaryWriter ----

SummaryWriter::SummaryWriter(const std::string& log_dir, const SummaryWriterOptions& options)
    : log_dir_(log_dir.empty() ? default_log_dir(options.comment) : log_dir), options_(options) {
  create_folder(log_dir_);
  file_ = std::make_unique<EventFileWriter>(log_dir_ + "/" + event_file_name(options_.filename_suffix),
                                            options_.max_queue, options_.flush_secs);
}

SummaryWriter::~SummaryWriter() {
  try {
    close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampgrad: SummaryWriter(%s): closing failed: %s\n", log_dir_.c_str(), e.what());
  }
}

void SummaryWriter::add_value(SummaryValue value, int64_t step, std::optional<double> wall_time) {
  AG_CHECK(!closed_, "SummaryWriter(", log_dir_, "): add_* after close()");
  file_->add_event({.wall_time = wall_time.value_or(unix_time_now()), .step = step, .file_version = {},
                    .values = {std::move(value)}});
}

void SummaryWriter::add_scalar(const std::string& tag, double value, int64_t step, std::optional<double> wall_time) {
  add_value({.tag = tag, .simple_value = static_cast<float>(value), .histo = {}}, step, wall_time);
}

void SummaryWriter::add_scalars(const std::string& main_tag, const std::map<std::string, double>& values, int64_t step,
                                std::optional<double> wall_time) {
  AG_CHECK(!closed_, "SummaryWriter(", log_dir_, "): add_scalars after close()");
  const double time = wall_time.value_or(unix_time_now());
  std::string prefix = main_tag;
  for (char& c : prefix)
    if (c == '/') c = '_';
  for (const auto& [key, value] : values) {
    const std::string folder = log_dir_ + "/" + prefix + "_" + key;
    auto it = scalars_files_.find(folder);
    if (it == scalars_files_.end()) {  // inserted only once it exists, so the map never holds a null writer
      create_folder(folder);
      auto file = std::make_unique<EventFileWriter>(folder + "/" + event_file_name(options_.filename_suffix),
                                                    options_.max_queue, options_.flush_secs);
      it = scalars_files_.emplace(folder, std::move(file)).first;
    }
    it->second->add_event({.wall_time = time, .step = step, .file_version = {},
                     .values = {{.tag = main_tag, .simple_value = static_cast<float>(value), .histo = {}}}});
  }
}

void SummaryWriter::add_histogram(const std::string& tag, std::span<const float> values, int64_t step,
                                  HistogramBins bins, std::optional<double> wall_time) {
  add_value({.tag = tag, .simple_value = {}, .histo = make_histogram(values, bins)}, step, wall_time);
}

void SummaryWriter::add_histogram(const std::string& tag, const Tensor& values, int64_t step, HistogramBins bins,
                                  std::optional<double> wall_time) {
  AG_CHECK(values.defined(), "SummaryWriter::add_histogram(", tag, "): the tensor is undefined");
  const std::vector<float> host = values.to_vector();
  add_histogram(tag, std::span<const float>(host), step, bins, wall_time);
}

void SummaryWriter::add_histogram_raw(const std::string& tag, const Histogram& histogram, int64_t step,
                                      std::optional<double> wall_time) {
  const size_t n = histogram.bucket_limit.size();
  AG_CHECK(n > 0 && histogram.bucket.size() == n, "add_histogram_raw(", tag, "): ", n, " bucket limits and ",
           histogram.bucket.size(), " counts; they must be as many, and at least one");
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    AG_CHECK(i == 0 || histogram.bucket_limit[i - 1] < histogram.bucket_limit[i], "add_histogram_raw(", tag,
             "): bucket limits must increase, got ", histogram.bucket_limit[i - 1], " then ", histogram.bucket_limit[i]);
    AG_CHECK(histogram.bucket[i] >= 0, "add_histogram_raw(", tag, "): bucket ", i, " has a negative count ",
             histogram.bucket[i]);
    total += histogram.bucket[i];
  }
  AG_CHECK(total == histogram.num, "add_histogram_raw(", tag, "): the counts sum to ", total, " but num is ",
           histogram.num);
  add_value({.tag = tag, .simple_value = {}, .histo = histogram}, step, wall_time);
}

void SummaryWriter::flush() {
  if (closed_) return;
  file_->flush();
  for (auto& [folder, file] : scalars_files_) file->flush();
}

void SummaryWriter::close() {
  if (closed_) return;
  closed_ = true;
  // Close every file even if one fails; report the first failure.
  std::string first_error;
  auto close_one = [&](EventFileWriter& f) {
    try {
      f.close();
    } catch (const Error& e) {
      if (first_error.empty()) first_error = e.what();
    }
  };
  close_one(*file_);
  for (auto& [folder, file] : scalars_files_) close_one(*file);
  if (!first_error.empty()) throw Error(first_error);
}

}  // namespace ampgrad::utils
