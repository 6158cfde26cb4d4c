// AMPGRAD_CUDA_PROFILE's recorder (see launch_profile.h): one event per checked launch, on the
// launching device's legacy stream, read back only when the profile is taken or when completed
// events are folded into running totals, so profiling never makes the host wait for the GPU and a
// long run holds a bounded number of events.
#include "framework/launch_profile.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string_view>

#include "framework/cuda_check.h"

namespace ampgrad::cuda {

namespace {

// Marks beyond this many trigger a fold of the completed ones.
constexpr size_t kFoldAt = 4096;

class Recorder {
 public:
  void record(const char* kernel) {
    int device = 0;
    AG_CUDA_CHECK(cudaGetDevice(&device));
    std::lock_guard<std::mutex> lock(mutex_);
    Timeline& line = timelines_[device];
    cudaEvent_t event = line.take_event();
    AG_CUDA_CHECK(cudaEventRecord(event, cudaStreamLegacy));
    line.marks.push_back({kernel, event});
    if (line.marks.size() >= kFoldAt) fold(line, /*wait=*/false);
  }

  std::vector<LaunchTime> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [device, line] : timelines_) {
      fold(line, /*wait=*/true);
      line.release(line.marks.size());  // the last mark too: the next launch starts a new clock
    }
    std::vector<LaunchTime> out;
    for (auto& [name, t] : totals_) out.push_back(std::move(t));
    totals_.clear();
    std::sort(out.begin(), out.end(), [](const LaunchTime& a, const LaunchTime& b) { return a.milliseconds > b.milliseconds; });
    return out;
  }

 private:
  struct Mark {
    const char* kernel;
    cudaEvent_t event;
  };

  // One device's marks in launch order and its spare events (an event belongs to its device).
  struct Timeline {
    std::vector<Mark> marks;
    std::vector<cudaEvent_t> spare;  // reused: creating one per launch would cost more than the launch

    cudaEvent_t take_event() {
      if (spare.empty()) {
        cudaEvent_t event = nullptr;
        AG_CUDA_CHECK(cudaEventCreate(&event));
        return event;
      }
      cudaEvent_t event = spare.back();
      spare.pop_back();
      return event;
    }
    // Recycles the first `count` marks' events and drops those marks.
    void release(size_t count) {
      for (size_t i = 0; i < count; ++i) spare.push_back(marks[i].event);
      marks.erase(marks.begin(), marks.begin() + static_cast<std::ptrdiff_t>(count));
    }
  };

  // Adds the time between consecutive completed marks to the totals and recycles all but the
  // last completed mark, which stays as the next interval's start. wait: first wait for all.
  void fold(Timeline& line, bool wait) {
    if (line.marks.empty()) return;
    if (wait) AG_CUDA_CHECK(cudaEventSynchronize(line.marks.back().event));
    size_t done = 0;  // marks[0..done] have completed
    while (done + 1 < line.marks.size()) {
      const cudaError_t status = cudaEventQuery(line.marks[done + 1].event);
      if (status == cudaErrorNotReady) break;  // not an error; do not leave it as the last error
      AG_CUDA_CHECK(status);
      float ms = 0;
      AG_CUDA_CHECK(cudaEventElapsedTime(&ms, line.marks[done].event, line.marks[done + 1].event));
      LaunchTime& t = totals_[line.marks[done + 1].kernel];
      t.kernel = line.marks[done + 1].kernel;
      ++t.launches;
      t.milliseconds += ms;
      ++done;
    }
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
    line.release(done);
  }

  std::mutex mutex_;
  std::map<int, Timeline> timelines_;  // by device
  std::map<std::string_view, LaunchTime> totals_;
};

// Never destroyed: destroying events at exit can run after the CUDA context is gone.
Recorder& recorder() {
  static Recorder* r = new Recorder;
  return *r;
}

}  // namespace

bool launch_profile_enabled() { return detail::profile_launches(); }

std::vector<LaunchTime> take_launch_profile() { return recorder().take(); }

namespace detail {
void record_launch(const char* kernel) { recorder().record(kernel); }
}  // namespace detail

}  // namespace ampgrad::cuda
