# cuda_library and if_cuda: .cu files are compiled by nvcc when @local_cuda found a toolkit,
# otherwise cuda_library is an empty cc_library (headers and deps only) and the build is CPU-only.
# See cuda_configure.bzl for how the toolkit is found (CUDA_PATH=/nonexistent forces CPU-only).
# Nothing here links cuBLAS: ops/linear/cublas_loader.cc loads it at run time, so a CUDA build's binaries
# start (CPU-only) on machines without the CUDA libraries.

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")
load("@local_cuda//:defs.bzl", "CUDA_FOUND", "CUDA_PATH", "NCCL_FOUND")

# GPU architectures to build for: machine code plus PTX for each. 90 = H100/H200 (Hopper).
CUDA_ARCHS = ["90"]

_NVCC_FLAGS = [
    "-std=c++20",
    "-Xcompiler",
    "-fPIC",
    "--expt-relaxed-constexpr",
    # Intermediate files beside the object, not in /tmp: nvcc names them after its process id,
    # which is the same in every sandbox (each has its own PID namespace), so two compiles at once
    # overwrote each other's (fatbinary: "Could not open input file /tmp/tmpxft_00000002_...").
    "--objdir-as-tempdir",
] + ["-gencode=arch=compute_%s,code=[sm_%s,compute_%s]" % (a, a, a) for a in CUDA_ARCHS]

# Per compilation mode (bazel -c): -lineinfo maps device code to source lines for compute-sanitizer
# and Nsight at no speed cost; -c dbg compiles device code unoptimised with full debug information
# (-G, for cuda-gdb), and only opt defines NDEBUG, as Bazel does for C++.
_NVCC_MODE_FLAGS = {
    "opt": ["-O3", "-lineinfo", "-DNDEBUG"],
    "fastbuild": ["-O1", "-lineinfo"],
    "dbg": ["-O0", "-g", "-G"],
}

# The GPU bundle (tools/gpu_check.sh build sets --define=gpu_bundle=1): device code compressed for
# size rather than nvcc's default balance. The machine code is the same; each shipped binary's
# fatbinary shrinks from about 4.8 MB to well under 1 MB, which keeps the bundle small. Needs nvcc
# 12.8 or newer and a driver from CUDA 12.4 on (r550); the bundle's CUDA 13 runtime already needs
# r580.
_NVCC_BUNDLE_FLAGS = ["--compress-mode=size"]

# The toolkit's library folder, for the run-time loader's last resort (after the dynamic linker's
# own search: LD_LIBRARY_PATH, the ldconfig cache).
CUDA_LIB_DIR = CUDA_PATH + "/lib64" if CUDA_FOUND else ""

def _nvcc_objects_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    cc = cc_common.merge_cc_infos(cc_infos = [d[CcInfo] for d in ctx.attr.deps]).compilation_context
    args = ["-ccbin", cc_toolchain.compiler_executable] + _NVCC_FLAGS
    args += _NVCC_MODE_FLAGS.get(ctx.var["COMPILATION_MODE"], [])
    if ctx.var.get("gpu_bundle") == "1":
        args += _NVCC_BUNDLE_FLAGS
    args += ["-I.", "-I" + ctx.bin_dir.path]
    for inc in cc.quote_includes.to_list() + cc.includes.to_list():
        args.append("-I" + inc)
    for inc in cc.system_includes.to_list():
        args += ["-isystem", inc]
    args += ["-D" + d for d in cc.defines.to_list() + ctx.attr.defines]
    args += ctx.attr.copts
    inputs = depset(ctx.files.srcs + ctx.files.hdrs, transitive = [cc.headers, cc_toolchain.all_files])
    objects = []

    # The package's folder as srcs' paths spell it (under external/NAME/ when ampgrad is a dependency).
    pkg_dir = "/".join([p for p in [ctx.label.workspace_root, ctx.label.package] if p])
    for src in ctx.files.srcs:
        rel = src.path[len(pkg_dir) + 1:] if pkg_dir else src.path
        obj = ctx.actions.declare_file("_nvcc/%s/%s.o" % (ctx.label.name, rel[:-len(".cu")]))
        ctx.actions.run(
            executable = CUDA_PATH + "/bin/nvcc",
            arguments = args + ["-c", src.path, "-o", obj.path],
            inputs = inputs,
            outputs = [obj],
            mnemonic = "NvccCompile",
            progress_message = "Compiling CUDA %s" % src.short_path,
            use_default_shell_env = True,  # nvcc and gcc need PATH (e.g. to find `as`)
        )
        objects.append(obj)
    return [DefaultInfo(files = depset(objects))]

_nvcc_objects = rule(
    implementation = _nvcc_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = True),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "defines": attr.string_list(),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], **kwargs):
    """A cc_library whose .cu srcs are compiled by nvcc; `copts` are extra nvcc flags.

    Other srcs (.cc, .h) go to the cc_library as they are. Dependants see AMPGRAD_WITH_CUDA=1.
    The CUDA runtime is linked statically; cuBLAS is not linked (ops/linear/cublas_loader.cc loads it).
    Without CUDA: cc_library(name, hdrs, deps) only, so dependants build CPU-only.
    """
    if not CUDA_FOUND:
        native.cc_library(name = name, hdrs = hdrs, deps = deps, **kwargs)
        return
    defines = ["AMPGRAD_WITH_CUDA=1"]
    _nvcc_objects(
        name = name + "_nvcc",
        srcs = [s for s in srcs if s.endswith(".cu")],
        hdrs = hdrs + [s for s in srcs if not s.endswith(".cu")],
        deps = deps,
        copts = copts,
        defines = defines,
        testonly = kwargs.get("testonly", False),
        tags = kwargs.get("tags", []),
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_nvcc"] + [s for s in srcs if not s.endswith(".cu")],
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart_static"],
        defines = defines,
        linkstatic = True,
        **kwargs
    )

def if_cuda(if_true, if_false = []):
    """Returns if_true when the CUDA toolkit was found, else if_false."""
    return if_true if CUDA_FOUND else if_false

def if_nccl(if_true, if_false = []):
    """Returns if_true when the CUDA toolkit has NCCL (include/nccl.h, lib64/libnccl.so.2), else if_false."""
    return if_true if NCCL_FOUND else if_false
