"""gpu_bundle_deps(): what a binary of the GPU bundle (tools/gpu_check.sh build) links in extra."""

def gpu_bundle_deps():
    return select({
        "//tools:gpu_bundle": ["//tools:glibc_compat"],
        "//conditions:default": [],
    })
