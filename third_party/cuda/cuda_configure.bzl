# Repository rule creating @local_cuda: the CUDA toolkit if one is installed, else empty targets.
# Lookup: $CUDA_PATH, then $CUDA_HOME, then /usr/local/cuda; the toolkit must have bin/nvcc.
# A variable set to a non-empty value ends the search: CUDA_PATH=/nonexistent forces a CPU-only build.

_ENV_VARS = ["CUDA_PATH", "CUDA_HOME"]
_DEFAULT_PATH = "/usr/local/cuda"

def _find_cuda(rctx):
    for var in _ENV_VARS:
        value = rctx.os.environ.get(var, "")
        if value:
            return value.rstrip("/") if rctx.path(value + "/bin/nvcc").exists else None
    return _DEFAULT_PATH if rctx.path(_DEFAULT_PATH + "/bin/nvcc").exists else None

_BUILD_FOUND = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**"]),
    includes = ["include"],
)

cc_library(
    name = "cudart_static",
    srcs = ["lib64/libcudart_static.a"],
    linkopts = ["-ldl", "-lpthread", "-lrt"],
    deps = [":cuda_headers"],
)

# For programs that call cuBLAS themselves; ampgrad does not link it (it loads it at run time).
cc_library(
    name = "cublas",
    linkopts = ["-L{lib}", "-lcublas", "-lcublasLt", "-Wl,-rpath,{lib}"],
    deps = [":cuda_headers"],
)
"""

_BUILD_ABSENT = """
package(default_visibility = ["//visibility:public"])

cc_library(name = "cuda_headers")

cc_library(name = "cudart_static")

cc_library(name = "cublas")
"""

def _cuda_configure_impl(rctx):
    path = _find_cuda(rctx)
    if path:
        rctx.symlink(path + "/include", "include")
        rctx.symlink(path + "/lib64", "lib64")
        rctx.file("BUILD", _BUILD_FOUND.format(lib = path + "/lib64"))
    else:
        rctx.file("BUILD", _BUILD_ABSENT)
    rctx.file("defs.bzl", "CUDA_FOUND = %s\nCUDA_PATH = %r\n" % (bool(path), path or ""))
    rctx.file("WORKSPACE", 'workspace(name = "%s")\n' % rctx.name)

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = _ENV_VARS,
    configure = True,
    local = True,
)
