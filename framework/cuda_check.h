// AG_CUDA_CHECK: every CUDA runtime call goes through it; a failure throws ampgrad::Error with
// file:line, the call, and CUDA's error name and text. Library code never exits.
#pragma once

#include <cuda_runtime.h>

#include "framework/error.h"

namespace ampgrad::cuda::detail {

[[noreturn]] inline void throw_cuda_error(const char* file, int line, const char* call, cudaError_t err) {
  // Header-only on purpose: framework/cuda references no non-inline framework symbol (see BUILD).
  throw ::ampgrad::Error(::ampgrad::detail::str_cat(file, ":", line, ": CUDA call `", call, "` failed: ",
                                                    cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

}  // namespace ampgrad::cuda::detail

/// AG_CUDA_CHECK(cudaMalloc(&p, n)): throws ampgrad::Error when the call does not return cudaSuccess.
#define AG_CUDA_CHECK(call)                                                             \
  do {                                                                                  \
    const cudaError_t ag_cuda_err_ = (call);                                            \
    if (ag_cuda_err_ != cudaSuccess) [[unlikely]]                                       \
      ::ampgrad::cuda::detail::throw_cuda_error(__FILE__, __LINE__, #call, ag_cuda_err_); \
  } while (false)

/// After a kernel launch: reports launch-configuration errors (asynchronous faults surface later).
#define AG_CUDA_CHECK_LAUNCH() AG_CUDA_CHECK(cudaGetLastError())
