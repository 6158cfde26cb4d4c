# ampgrad_dependencies(): every external repository ampgrad needs. ampgrad's own WORKSPACE and any
# workspace that uses ampgrad call it; a repository the calling workspace already declared is kept.
load("//third_party/cuda:cuda_configure.bzl", "cuda_configure")

# Rule repositories Bazel 4 would download; offline stand-ins live in third_party/bazel_shims/NAME.
_SHIMS = ["rules_cc", "rules_java", "remote_coverage_tools"]

# System libraries: repository name -> where its Debian package (listed in ./bazelw) installs it.
# The BUILD file is third_party/NAME.BUILD. A new system library is one entry here.
_SYSTEM_LIBRARIES = {
    "eigen": "/usr/include/eigen3",  # libeigen3-dev
    "gtest": "/usr",  # libgtest-dev (ampgrad's tests only)
    "benchmark": "/usr",  # libbenchmark-dev (ampgrad's benchmarks only)
    "nlohmann_json": "/usr/include",  # nlohmann-json3-dev
    "zlib": "/usr",  # zlib1g-dev (data/: gzip-compressed data sets)
    "openmpi": "/usr/lib/x86_64-linux-gnu/openmpi",  # libopenmpi-dev, openmpi-bin (distributed/ only)
}

def _shim_repository_impl(rctx):
    # local_repository(path = ...) would resolve a relative path against the calling workspace, not
    # against ampgrad, so find the checkout through a label and link the shim's files from there.
    checkout = rctx.path(rctx.attr.anchor).dirname
    shim = checkout.get_child("third_party").get_child("bazel_shims").get_child(rctx.name)
    for entry in shim.readdir():
        rctx.symlink(entry, entry.basename)

_shim_repository = repository_rule(
    implementation = _shim_repository_impl,
    attrs = {"anchor": attr.label(default = Label("//:deps.bzl"))},
    local = True,
)

def ampgrad_dependencies():
    """Declares the repositories ampgrad needs, except those the workspace already declared."""
    existing = native.existing_rules()
    for name in _SHIMS:
        if name not in existing:
            _shim_repository(name = name)
    for name, path in _SYSTEM_LIBRARIES.items():
        if name not in existing:
            native.new_local_repository(
                name = name,
                # Label() resolves inside ampgrad's repository, whatever the caller named it.
                build_file = str(Label("//third_party:%s.BUILD" % name)),
                path = path,
            )

    # Optional CUDA toolkit: @local_cuda always exists, with empty targets when no toolkit is found.
    if "local_cuda" not in existing:
        cuda_configure(name = "local_cuda")
