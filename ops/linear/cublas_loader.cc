// Loads cuBLAS with dlopen instead of linking it: binaries of a CUDA build then need no CUDA
// library to start (the runtime is static), and only a GEMM on a GPU needs libcublas.so.
#include "ops/linear/cublas.h"
#include "ops/linear/cuda_library.h"

namespace ampgrad::kernels::cuda {

namespace {

#define AG_CUBLAS_STR2(x) #x
#define AG_CUBLAS_STR(x) AG_CUBLAS_STR2(x)  // expands cublas_v2.h's macros: cublasCreate -> cublasCreate_v2

template <typename Fn>
void resolve(void* lib, const std::string& path, const char* symbol, Fn& fn) {
  library::resolve(lib, "cuBLAS", path, symbol, CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR, fn);
}

}  // namespace

std::vector<std::string> cublas_candidates() { return library::candidates("libcublas", CUBLAS_VER_MAJOR); }

CublasApi load_cublas(const std::vector<std::string>& candidates) {
  std::string tried, path;
  if (void* lib = library::open_first(candidates, path, tried); lib != nullptr) {
    CublasApi api;
    api.path = path;
    resolve(lib, path, AG_CUBLAS_STR(cublasCreate), api.create);
    resolve(lib, path, AG_CUBLAS_STR(cublasDestroy), api.destroy);
    resolve(lib, path, AG_CUBLAS_STR(cublasSetStream), api.set_stream);
    resolve(lib, path, AG_CUBLAS_STR(cublasSetMathMode), api.set_math_mode);
    resolve(lib, path, AG_CUBLAS_STR(cublasGemmEx), api.gemm_ex);
    resolve(lib, path, AG_CUBLAS_STR(cublasGemmStridedBatchedEx), api.gemm_strided_batched_ex);
    resolve(lib, path, AG_CUBLAS_STR(cublasGetStatusName), api.status_name);
    resolve(lib, path, AG_CUBLAS_STR(cublasGetStatusString), api.status_string);
    return api;
  }
  AG_FAIL("cuBLAS could not be loaded; tried:", tried, "\nhint: a GEMM on the GPU needs cuBLAS ",
          CUBLAS_VER_MAJOR, ": install the CUDA ", CUBLAS_VER_MAJOR,
          " toolkit or the nvidia-cublas Python wheel, and add the folder holding libcublas.so.",
          CUBLAS_VER_MAJOR, " to LD_LIBRARY_PATH");
}

const CublasApi& cublas() {
  // A static's initialisation is thread-safe, and one that throws is attempted again next call.
  static const CublasApi api = load_cublas(cublas_candidates());
  return api;
}

}  // namespace ampgrad::kernels::cuda
