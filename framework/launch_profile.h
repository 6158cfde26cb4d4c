// Where the GPU's time goes, kernel by kernel, without synchronising (AMPGRAD_CUDA_PROFILE=1).
// Every checked launch (AG_CUDA_CHECK_LAUNCH, which cuBLAS GEMMs pass through too) records a CUDA
// event behind its kernel on the legacy stream; the time from one event to the next is that
// kernel's time on the GPU, plus any time the GPU sat idle waiting for the host, so profile code
// that keeps the GPU busy. Copies and memsets are not checked launches: they count with the launch
// after them. Each device has its own timeline; launches from several host threads onto one device
// share it, so their times may be billed to each other's names. Completed events are folded into
// running totals as the run goes, so a long run holds a bounded number. Defined in CUDA builds only
// (framework:cuda).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ampgrad::cuda {

struct LaunchTime {
  std::string kernel;  // the name given to AG_CUDA_CHECK_LAUNCH
  int64_t launches = 0;
  double milliseconds = 0;  // summed over the launches
};

/// Whether launches are profiled: AMPGRAD_CUDA_PROFILE=1 (0 or unset: off; anything else is an
/// error), read once.
bool launch_profile_enabled();

/// The launches recorded since the previous call, summed per kernel name, most time first; the
/// first launch after a call only starts the clock. Waits for the GPU. Empty when nothing was
/// recorded (profiling off).
std::vector<LaunchTime> take_launch_profile();

}  // namespace ampgrad::cuda
