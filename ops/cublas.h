// AG_CUBLAS_CHECK and the per-thread, per-device cuBLAS handle used by the GEMM kernels.
#pragma once

#include <cublas_v2.h>

#include "framework/error.h"

namespace ampgrad::kernels::cuda {

[[noreturn]] inline void throw_cublas_error(const char* file, int line, const char* call, cublasStatus_t status) {
  throw ::ampgrad::Error(::ampgrad::detail::str_cat(file, ":", line, ": cuBLAS call `", call, "` failed: ",
                                                    cublasGetStatusName(status), " (", cublasGetStatusString(status),
                                                    ")"));
}

/// A cuBLAS handle for this thread and the current device, created on first use.
cublasHandle_t cublas_handle();

}  // namespace ampgrad::kernels::cuda

/// AG_CUBLAS_CHECK(cublasSgemm(...)): throws ampgrad::Error unless CUBLAS_STATUS_SUCCESS.
#define AG_CUBLAS_CHECK(call)                                                                     \
  do {                                                                                            \
    const cublasStatus_t ag_cublas_status_ = (call);                                              \
    if (ag_cublas_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                  \
      ::ampgrad::kernels::cuda::throw_cublas_error(__FILE__, __LINE__, #call, ag_cublas_status_); \
  } while (false)
