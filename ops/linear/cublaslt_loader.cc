// Loads cuBLASLt with dlopen instead of linking it, as cublas_loader.cc does cuBLAS: only an FP8
// GEMM on a GPU needs libcublasLt.so (libcublas.so needs it too, through its own runpath).
#include <cuda_runtime.h>

#include "framework/cuda_check.h"
#include "ops/linear/cuda_library.h"
#include "ops/linear/cublaslt.h"

namespace ampgrad::kernels::cuda {

namespace {

template <typename Fn>
void resolve(void* lib, const std::string& path, const char* symbol, Fn& fn) {
  library::resolve(lib, "cuBLASLt", path, symbol, CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR, fn);
}

}  // namespace

std::vector<std::string> cublaslt_candidates() { return library::candidates("libcublasLt", CUBLAS_VER_MAJOR); }

CublasLtApi load_cublaslt(const std::vector<std::string>& candidates) {
  std::string tried, path;
  if (void* lib = library::open_first(candidates, path, tried); lib != nullptr) {
    CublasLtApi api;
    api.path = path;
    resolve(lib, path, "cublasLtCreate", api.create);
    resolve(lib, path, "cublasLtDestroy", api.destroy);
    resolve(lib, path, "cublasLtMatmulDescCreate", api.matmul_desc_create);
    resolve(lib, path, "cublasLtMatmulDescDestroy", api.matmul_desc_destroy);
    resolve(lib, path, "cublasLtMatmulDescSetAttribute", api.matmul_desc_set_attribute);
    resolve(lib, path, "cublasLtMatrixLayoutCreate", api.matrix_layout_create);
    resolve(lib, path, "cublasLtMatrixLayoutDestroy", api.matrix_layout_destroy);
    resolve(lib, path, "cublasLtMatmulPreferenceCreate", api.preference_create);
    resolve(lib, path, "cublasLtMatmulPreferenceDestroy", api.preference_destroy);
    resolve(lib, path, "cublasLtMatmulPreferenceSetAttribute", api.preference_set_attribute);
    resolve(lib, path, "cublasLtMatmulAlgoGetHeuristic", api.algo_get_heuristic);
    resolve(lib, path, "cublasLtMatmul", api.matmul);
    resolve(lib, path, "cublasLtGetStatusName", api.status_name);
    resolve(lib, path, "cublasLtGetStatusString", api.status_string);
    return api;
  }
  AG_FAIL("cuBLASLt could not be loaded; tried:", tried, "\nhint: an FP8 GEMM on the GPU needs cuBLASLt ",
          CUBLAS_VER_MAJOR, " (it ships beside cuBLAS: the CUDA ", CUBLAS_VER_MAJOR,
          " toolkit or the nvidia-cublas Python wheel); add the folder holding libcublasLt.so.", CUBLAS_VER_MAJOR,
          " to LD_LIBRARY_PATH");
}

const CublasLtApi& cublaslt() {
  static const CublasLtApi api = load_cublaslt(cublaslt_candidates());
  return api;
}

cublasLtHandle_t cublaslt_handle() {
  // One per (thread, device), never destroyed, for cublas_handle()'s reasons (linear_cuda.cu). A
  // cuBLASLt handle holds no stream: each matmul names its own.
  thread_local std::vector<cublasLtHandle_t> handles;
  int device = 0;
  AG_CUDA_CHECK(cudaGetDevice(&device));
  if (handles.size() <= static_cast<size_t>(device)) handles.resize(static_cast<size_t>(device) + 1, nullptr);
  if (handles[device] == nullptr) AG_CUBLASLT_CHECK(cublaslt().create(&handles[device]));
  return handles[device];
}

}  // namespace ampgrad::kernels::cuda
