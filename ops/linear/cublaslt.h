// cuBLASLt for the FP8 GEMM (linear_float8_gemm_cuda.cu): the entry points it uses, resolved at run
// time as cublas.h's are (a CUDA build's binaries still start without CUDA libraries),
// AG_CUBLASLT_CHECK, and the per-thread, per-device handle.
#pragma once

#include <cublasLt.h>

#include <string>
#include <vector>

#include "framework/error.h"

namespace ampgrad::kernels::cuda {

/// The cuBLASLt functions ampgrad calls, resolved from libcublasLt.so.<major> by dlopen on first use.
struct CublasLtApi {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtMatmulDescCreate) matmul_desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) matmul_desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) matmul_desc_set_attribute = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) matrix_layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) matrix_layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) preference_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set_attribute = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) algo_get_heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  decltype(&cublasLtGetStatusName) status_name = nullptr;
  decltype(&cublasLtGetStatusString) status_string = nullptr;
  std::string path;  // the library file as given to dlopen
};

/// "libcublasLt.so.<major>" (the dynamic linker's search), then the same file in the build's toolkit.
std::vector<std::string> cublaslt_candidates();

/// Loads cuBLASLt from the first of `candidates` that dlopen accepts and resolves every entry
/// point; throws ampgrad::Error naming each candidate and dlopen's reason, with a hint.
CublasLtApi load_cublaslt(const std::vector<std::string>& candidates);

/// The process's cuBLASLt, loaded on first use (thread-safe; a failed load is retried next call).
const CublasLtApi& cublaslt();

[[noreturn]] inline void throw_cublaslt_error(const char* file, int line, const char* call, cublasStatus_t status) {
  throw ::ampgrad::Error(::ampgrad::detail::str_cat(
      file, ":", line, ": cuBLASLt call `", call, "` failed: ", cublaslt().status_name(status), " (",
      cublaslt().status_string(status), "); hint: AMPGRAD_CUDA_SYNC=1 and CUBLASLT_LOG_LEVEL=2 say more"));
}

/// A cuBLASLt handle for this thread and the current device, created on first use.
cublasLtHandle_t cublaslt_handle();

}  // namespace ampgrad::kernels::cuda

/// AG_CUBLASLT_CHECK(cublaslt().matmul(...)): throws ampgrad::Error unless CUBLAS_STATUS_SUCCESS.
#define AG_CUBLASLT_CHECK(call)                                                                       \
  do {                                                                                                \
    const cublasStatus_t ag_cublaslt_status_ = (call);                                                \
    if (ag_cublaslt_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                    \
      ::ampgrad::kernels::cuda::throw_cublaslt_error(__FILE__, __LINE__, #call, ag_cublaslt_status_); \
  } while (false)
