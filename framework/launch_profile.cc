// AMPGRAD_CUDA_PROFILE's recorder (see launch_profile.h): one event per checked launch, read back
// only when the profile is taken, so profiling never makes the host wait for the GPU.
#include "framework/launch_profile.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string_view>

#include "framework/cuda_check.h"

namespace ampgrad::cuda {

namespace {

class Recorder {
 public:
  void record(const char* kernel) {
    std::lock_guard<std::mutex> lock(mutex_);
    cudaEvent_t event = take_event();
    AG_CUDA_CHECK(cudaEventRecord(event, cudaStreamLegacy));
    marks_.push_back({kernel, event});
  }

  std::vector<LaunchTime> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::map<std::string_view, LaunchTime> by_name;
    if (!marks_.empty()) AG_CUDA_CHECK(cudaEventSynchronize(marks_.back().event));
    for (size_t i = 1; i < marks_.size(); ++i) {
      float ms = 0;
      AG_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[i - 1].event, marks_[i].event));
      LaunchTime& t = by_name[marks_[i].kernel];
      t.kernel = marks_[i].kernel;
      ++t.launches;
      t.milliseconds += ms;
    }
    for (const Mark& m : marks_) free_.push_back(m.event);
    marks_.clear();
    std::vector<LaunchTime> out;
    for (auto& [name, t] : by_name) out.push_back(std::move(t));
    std::sort(out.begin(), out.end(), [](const LaunchTime& a, const LaunchTime& b) { return a.milliseconds > b.milliseconds; });
    return out;
  }

 private:
  struct Mark {
    const char* kernel;
    cudaEvent_t event;
  };

  cudaEvent_t take_event() {
    if (free_.empty()) {
      cudaEvent_t event = nullptr;
      AG_CUDA_CHECK(cudaEventCreate(&event));
      return event;
    }
    cudaEvent_t event = free_.back();
    free_.pop_back();
    return event;
  }

  std::mutex mutex_;
  std::vector<Mark> marks_;
  std::vector<cudaEvent_t> free_;  // events are reused: creating one per launch would cost more than the launch
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
