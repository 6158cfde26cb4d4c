// cuBLAS for the GEMM kernels: its entry points resolved at run time (so a CUDA build's binaries
// start, CPU-only, where cuBLAS is absent), AG_CUBLAS_CHECK, and the per-thread, per-device handle.
#pragma once

#include <cublas_v2.h>

#include <string>
#include <vector>

#include "framework/error.h"

namespace ampgrad::kernels::cuda {

// cublasGemmEx and cublasGemmStridedBatchedEx are overloaded in C++ (a legacy cudaDataType compute
// type): these are the cublasComputeType_t versions, the library's exported symbols.
using CublasGemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                        const void*, const void*, cudaDataType, int, const void*, cudaDataType, int,
                                        const void*, void*, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
using CublasGemmStridedBatchedEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                                      int, const void*, const void*, cudaDataType, int, long long,
                                                      const void*, cudaDataType, int, long long, const void*, void*,
                                                      cudaDataType, int, long long, int, cublasComputeType_t,
                                                      cublasGemmAlgo_t);

/// The cuBLAS functions ampgrad calls, resolved from libcublas.so.<major> by dlopen on first use.
struct CublasApi {
  decltype(&cublasCreate) create = nullptr;
  decltype(&cublasDestroy) destroy = nullptr;
  decltype(&cublasSetStream) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  CublasGemmEx gemm_ex = nullptr;
  CublasGemmStridedBatchedEx gemm_strided_batched_ex = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
  std::string path;  // the library file as given to dlopen
};

/// The library names tried, in order: "libcublas.so.<major>" (the dynamic linker's search:
/// LD_LIBRARY_PATH, the ldconfig cache), then the same file in the toolkit this was built with.
std::vector<std::string> cublas_candidates();

/// Loads cuBLAS from the first of `candidates` that dlopen accepts and resolves every entry point.
/// Throws ampgrad::Error naming each candidate and dlopen's reason, with a hint. (Tests call it
/// with made-up paths; the kernels use cublas().)
CublasApi load_cublas(const std::vector<std::string>& candidates);

/// The process's cuBLAS, loaded from cublas_candidates() on first use (thread-safe). A failed load
/// throws and is retried on the next call.
const CublasApi& cublas();

[[noreturn]] inline void throw_cublas_error(const char* file, int line, const char* call, cublasStatus_t status) {
  // Only reached after a cuBLAS call returned, so cublas() is loaded.
  throw ::ampgrad::Error(::ampgrad::detail::str_cat(file, ":", line, ": cuBLAS call `", call, "` failed: ",
                                                    cublas().status_name(status), " (",
                                                    cublas().status_string(status), ")"));
}

/// A cuBLAS handle for this thread and the current device, created on first use.
cublasHandle_t cublas_handle();

}  // namespace ampgrad::kernels::cuda

/// AG_CUBLAS_CHECK(cublas().gemm_ex(...)): throws ampgrad::Error unless CUBLAS_STATUS_SUCCESS.
#define AG_CUBLAS_CHECK(call)                                                                     \
  do {                                                                                            \
    const cublasStatus_t ag_cublas_status_ = (call);                                              \
    if (ag_cublas_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                  \
      ::ampgrad::kernels::cuda::throw_cublas_error(__FILE__, __LINE__, #call, ag_cublas_status_); \
  } while (false)
