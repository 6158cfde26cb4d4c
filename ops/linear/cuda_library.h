// Loading a CUDA math library (cuBLAS, cuBLASLt) with dlopen: the files tried, the first that
// loads, and its entry points by name, with errors that say what was tried and what to install.
// The binaries of a CUDA build link the runtime statically and need these libraries only for a
// GEMM on a GPU.
#pragma once

#include <dlfcn.h>

#include <string>
#include <vector>

#include "framework/error.h"
#include "ops/cuda_paths.h"

namespace ampgrad::kernels::cuda::library {

/// The files tried for "<base>.so.<major>" (base "libcublas", say), in order: the name alone (the
/// dynamic linker's search: LD_LIBRARY_PATH, the ldconfig cache), then the file in the toolkit
/// this was built with.
inline std::vector<std::string> candidates(const std::string& base, int major) {
  const std::string name = base + ".so." + std::to_string(major);
  return {name, std::string(AMPGRAD_CUDA_LIB_DIR) + "/" + name};
}

/// dlopen's handle of the first of `candidates` it accepts, whose name goes to `path`; null when
/// none loads, with each candidate and dlopen's reason appended to `tried`. The library stays
/// loaded for the life of the process. RTLD_LOCAL: each finds its own dependencies through its
/// runpath.
inline void* open_first(const std::vector<std::string>& candidates, std::string& path, std::string& tried) {
  for (const std::string& candidate : candidates) {
    void* lib = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) {
      path = candidate;
      return lib;
    }
    const char* why = dlerror();
    tried += "\n  " + candidate + ": " + (why != nullptr ? why : "not loaded");
  }
  return nullptr;
}

/// fn = `symbol`'s address in `lib` (loaded from `path`); throws an Error naming `library` and the
/// version this was built with when it is missing (an older library).
template <typename Fn>
void resolve(void* lib, const char* library, const std::string& path, const char* symbol, int major, int minor,
             Fn& fn) {
  dlerror();
  void* address = dlsym(lib, symbol);
  AG_CHECK(address != nullptr, library, ": ", path, " has no symbol ", symbol, " (", dlerror(), "); hint: ampgrad needs ",
           library, " ", major, ".", minor, " or a newer ", major, ".x");
  fn = reinterpret_cast<Fn>(address);
}

}  // namespace ampgrad::kernels::cuda::library
