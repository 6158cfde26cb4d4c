// Device facts: what this build and this machine have, synchronisation, and the one error for a
// device without a backend.
#include "framework/device.h"

#include <atomic>

#include "framework/error.h"

#if defined(AMPGRAD_WITH_CUDA)
#include "framework/device_cuda.h"
#endif

namespace ampgrad {

std::ostream& operator<<(std::ostream& out, Device device) { return out << device_name(device); }

bool cuda_is_compiled() {
#if defined(AMPGRAD_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

bool cuda_is_available() { return device_count(Device::kCUDA) > 0; }

int device_count(Device device) {
  if (device == Device::kCPU) return 1;
#if defined(AMPGRAD_WITH_CUDA)
  return cuda::device_count();
#else
  return 0;
#endif
}

void synchronize(Device device) {
  if (device == Device::kCPU) return;
  require_backend(device, "synchronize");
#if defined(AMPGRAD_WITH_CUDA)
  cuda::synchronize();
#endif
}

int64_t cuda_host_sync_count() {
#if defined(AMPGRAD_WITH_CUDA)
  return cuda::host_sync_count();
#else
  return 0;
#endif
}

void require_backend(Device device, std::string_view what) {
  if (device == Device::kCPU || cuda_is_compiled()) return;
  AG_FAIL(what, " on ", device, ": this build of ampgrad has no CUDA backend (the CUDA toolkit was not found ",
          "when it was built); hint: keep tensors on Device::kCPU, or rebuild on a machine with the CUDA toolkit");
}

namespace cuda {
namespace {
std::atomic<bool> tf32_allowed{false};
}  // namespace
void set_allow_tf32(bool allow) { tf32_allowed.store(allow); }
bool allow_tf32() { return tf32_allowed.load(); }

std::string unavailable_reason() {
#if defined(AMPGRAD_WITH_CUDA)
  if (cuda_is_available()) return "";
  if (!device_query_error().empty()) return device_query_error();
  return "the CUDA driver reports no device (check nvidia-smi and CUDA_VISIBLE_DEVICES)";
#else
  return "this build of ampgrad has no CUDA backend (the CUDA toolkit was not found when it was built)";
#endif
}
}  // namespace cuda

}  // namespace ampgrad
