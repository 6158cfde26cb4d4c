// AG_CUDA_CHECK: every CUDA runtime call goes through it; a failure throws ampgrad::Error with
// file:line, the call, and CUDA's error name and text. AG_CUDA_CHECK_LAUNCH("kernel") after every
// launch, which with AMPGRAD_CUDA_SYNC=1 also waits for the kernel, so a fault names it, and with
// AMPGRAD_CUDA_PROFILE=1 times it (launch_profile.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <string_view>

#include "framework/error.h"

namespace ampgrad::cuda::detail {

/// The value of a debugging switch such as AMPGRAD_CUDA_SYNC: unset, "" or "0" is off, "1" is on;
/// anything else is an error (a typo must not silently leave a debugging run asynchronous).
inline bool parse_switch(std::string_view variable, const char* value) {
  const std::string_view v = value == nullptr ? "" : value;
  if (v.empty() || v == "0") return false;
  if (v == "1") return true;
  throw ::ampgrad::Error(::ampgrad::detail::str_cat(variable, " must be 0 or 1 (unset means 0), got '", v, "'"));
}
inline bool parse_sync_flag(const char* value) { return parse_switch("AMPGRAD_CUDA_SYNC", value); }

/// Whether every kernel launch waits for the kernel and checks it (AMPGRAD_CUDA_SYNC=1, read once).
inline bool sync_after_launch() {
  static const bool on = parse_sync_flag(std::getenv("AMPGRAD_CUDA_SYNC"));
  return on;
}

/// Whether every checked launch is timed (AMPGRAD_CUDA_PROFILE=1, read once; launch_profile.h).
inline bool profile_launches() {
  static const bool on = parse_switch("AMPGRAD_CUDA_PROFILE", std::getenv("AMPGRAD_CUDA_PROFILE"));
  return on;
}

/// Records a launch of `kernel` (a string literal) for the profile (framework/launch_profile_cuda.cc).
void record_launch(const char* kernel);

// Errors a faulting kernel leaves behind: asynchronous, so reported by whichever call comes next.
inline bool is_kernel_fault(cudaError_t err) {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorMisalignedAddress:
    case cudaErrorIllegalInstruction:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
      return true;
    default:
      return false;
  }
}

inline std::string_view fault_hint(cudaError_t err) {
  return is_kernel_fault(err) && !sync_after_launch()
             ? "; hint: a kernel fault is reported by the next CUDA call, not by the kernel that made it: rerun "
               "with AMPGRAD_CUDA_SYNC=1 to have the failing kernel named"
             : "";
}

[[noreturn]] inline void throw_cuda_error(const char* file, int line, const char* call, cudaError_t err) {
  // Header-only on purpose: framework/cuda references no non-inline framework symbol (see BUILD);
  // check_launch's record_launch is framework:cuda's own (launch_profile_cuda.cc).
  throw ::ampgrad::Error(::ampgrad::detail::str_cat(file, ":", line, ": CUDA call `", call, "` failed: ",
                                                    cudaGetErrorName(err), " (", cudaGetErrorString(err), ")",
                                                    fault_hint(err)));
}

/// After a launch of `kernel`: a configuration error, and with AMPGRAD_CUDA_SYNC=1 the kernel's
/// own fault (it waits for the kernel), throws an Error naming the kernel and the launch site.
inline void check_launch(const char* file, int line, const char* kernel) {
  cudaError_t err = cudaGetLastError();
  const bool synced = err == cudaSuccess && sync_after_launch();
  if (synced) err = cudaDeviceSynchronize();
  if (err == cudaSuccess) [[likely]] {
    if (profile_launches()) [[unlikely]]
      record_launch(*kernel != '\0' ? kernel : "(unnamed)");
    return;
  }
  const std::string_view name = *kernel != '\0' ? kernel : "(unnamed)";
  const char* what = synced ? " failed (AMPGRAD_CUDA_SYNC=1 waited for it): " : " failed to launch: ";
  throw ::ampgrad::Error(::ampgrad::detail::str_cat(file, ":", line, ": CUDA kernel ", name, what, cudaGetErrorName(err),
                                                    " (", cudaGetErrorString(err), ")", synced ? "" : fault_hint(err)));
}

// AG_CUDA_CHECK_LAUNCH's optional argument.
inline const char* launch_name() { return ""; }
inline const char* launch_name(const char* kernel) { return kernel; }

}  // namespace ampgrad::cuda::detail

/// AG_CUDA_CHECK(cudaMalloc(&p, n)): throws ampgrad::Error when the call does not return cudaSuccess.
#define AG_CUDA_CHECK(call)                                                             \
  do {                                                                                  \
    const cudaError_t ag_cuda_err_ = (call);                                            \
    if (ag_cuda_err_ != cudaSuccess) [[unlikely]]                                       \
      ::ampgrad::cuda::detail::throw_cuda_error(__FILE__, __LINE__, #call, ag_cuda_err_); \
  } while (false)

/// After a kernel launch: AG_CUDA_CHECK_LAUNCH("relu_kernel") reports launch-configuration errors;
/// with AMPGRAD_CUDA_SYNC=1 it also waits for the kernel and reports its fault, naming it. (The
/// name may be left out; the message then has only the launch site.)
#define AG_CUDA_CHECK_LAUNCH(...) \
  ::ampgrad::cuda::detail::check_launch(__FILE__, __LINE__, ::ampgrad::cuda::detail::launch_name(__VA_ARGS__))
