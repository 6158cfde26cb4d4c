// Devices: which exist in this build and on this machine, waiting for them, and the one place that
// turns a tensor's device into a backend (AG_ON_BACKEND) or into the "built without CUDA" error.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace ampgrad {

/// Where a tensor's storage lives: host memory or a CUDA GPU.
enum class Device : uint8_t { kCPU, kCUDA };
inline constexpr size_t kNumDevices = 2;  ///< sizes per-device state (autocast, allocators)
/// Every device kind, in enum order.
inline constexpr std::array<Device, kNumDevices> kAllDevices = {Device::kCPU, Device::kCUDA};

/// Whether a host-to-device copy may return before it has finished (Tensor::to(Device, NonBlocking)).
enum class NonBlocking : bool { kNo, kYes };

/// The device's position in per-device arrays.
constexpr size_t device_index(Device device) { return static_cast<size_t>(device); }
/// "cpu" or "cuda".
constexpr std::string_view device_name(Device device) { return device == Device::kCPU ? "cpu" : "cuda"; }
std::ostream& operator<<(std::ostream& out, Device device);  ///< prints device_name(device)

/// Whether this build has the CUDA backend (the toolkit was found when it was compiled).
bool cuda_is_compiled();
/// True when the CUDA backend is compiled in and a usable GPU and driver are present.
bool cuda_is_available();
/// Usable devices of a kind: 1 for the CPU; GPUs for CUDA (0 without a driver or a CUDA build).
int device_count(Device device);
/// Waits until every queued operation on `device` has finished (nothing to wait for on the CPU).
void synchronize(Device device);
/// How many times the host has waited for the GPU so far: synchronize(kCUDA), device-to-host
/// copies (item(), to_vector()) and host-to-device copies, which wait for queued work too, except
/// non-blocking ones from pinned memory (Tensor::pin_memory). The benchmarks use it to count host
/// syncs per training step. 0 without CUDA.
int64_t cuda_host_sync_count();

/// Throws the one error for work on a device this build has no backend for; `what` names the
/// operation ("linear", "copy_") for the message. Returns normally for available backends.
void require_backend(Device device, std::string_view what);

namespace cuda {
/// Whether float32 GEMMs on CUDA may use TF32 tensor cores (inputs rounded to 10 mantissa bits,
/// FP32 accumulation), like PyTorch's torch.backends.cuda.matmul.allow_tf32. Off by default, so
/// float32 results match the CPU to float rounding. Process-wide; no effect on the CPU.
void set_allow_tf32(bool allow);
/// Whether TF32 is allowed (see set_allow_tf32).
bool allow_tf32();
/// Why cuda_is_available() is false ("" when it is true): a CPU-only build, the CUDA runtime's
/// error (e.g. cudaErrorInsufficientDriver: no driver, or one older than the runtime), or no device.
std::string unavailable_reason();
}  // namespace cuda

}  // namespace ampgrad

/// AG_HOST_DEVICE marks a function both backends compile: __host__ __device__ under nvcc, nothing
/// for the C++ compiler (shared formulas and index math, written once).
#if defined(__CUDACC__)
#define AG_HOST_DEVICE __host__ __device__
#else
#define AG_HOST_DEVICE
#endif

/// AG_ON_BACKEND(device, kernel, args...): calls cuda::kernel(args...) for Device::kCUDA and
/// cpu::kernel(args...) otherwise, from inside a kernel family's namespace. In a build without
/// CUDA the cuda:: declaration is never referenced and a CUDA device gets require_backend's error.
#if defined(AMPGRAD_WITH_CUDA)
#define AG_ON_BACKEND(device, kernel, ...) \
  ((device) == ::ampgrad::Device::kCUDA ? cuda::kernel(__VA_ARGS__) : cpu::kernel(__VA_ARGS__))
#else
#define AG_ON_BACKEND(device, kernel, ...) (::ampgrad::require_backend((device), #kernel), cpu::kernel(__VA_ARGS__))
#endif
