# Repository rule creating @local_cuda: the CUDA toolkit if one is installed, else empty targets.
# Lookup: $CUDA_PATH, then $CUDA_HOME, then /usr/local/cuda; the toolkit must have bin/nvcc.
# A variable set to a non-empty value ends the search: CUDA_PATH=/nonexistent forces a CPU-only build.
# NCCL (@local_cuda//:nccl) is the toolkit's own when it has include/nccl.h and lib64/libnccl.so.2;
# otherwise that target is empty and NCCL_FOUND is False.

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

# Linked by soname with an rpath to the toolkit, like cuBLAS: only distributed/ depends on it.
_NCCL_FOUND = """
cc_library(
    name = "nccl",
    linkopts = ["-L{lib}", "-l:libnccl.so.2", "-Wl,-rpath,{lib}"],
    deps = [":cuda_headers"],
)
"""

_NCCL_ABSENT = """
cc_library(name = "nccl")
"""

_BUILD_ABSENT = """
package(default_visibility = ["//visibility:public"])

cc_library(name = "cuda_headers")

cc_library(name = "cudart_static")

cc_library(name = "cublas")
"""

def _cuda_configure_impl(rctx):
    path = _find_cuda(rctx)
    nccl = bool(path) and rctx.path(path + "/include/nccl.h").exists and rctx.path(path + "/lib64/libnccl.so.2").exists
    if path:
        rctx.symlink(path + "/include", "include")
        rctx.symlink(path + "/lib64", "lib64")
        build = _BUILD_FOUND + (_NCCL_FOUND if nccl else _NCCL_ABSENT)
        rctx.file("BUILD", build.format(lib = path + "/lib64"))
    else:
        rctx.file("BUILD", _BUILD_ABSENT + _NCCL_ABSENT)
    rctx.file("defs.bzl", "CUDA_FOUND = %s\nCUDA_PATH = %r\nNCCL_FOUND = %s\n" % (bool(path), path or "", nccl))
    rctx.file("WORKSPACE", 'workspace(name = "%s")\n' % rctx.name)

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = _ENV_VARS,
    configure = True,
    local = True,
)
