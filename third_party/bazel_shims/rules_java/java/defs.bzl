# Offline stand-in for @rules_java//java:defs.bzl: each rule forwards to the native rule built into Bazel.

def java_import(**kwargs):
    native.java_import(**kwargs)

def java_runtime(**kwargs):
    native.java_runtime(**kwargs)

def java_toolchain(**kwargs):
    native.java_toolchain(**kwargs)

def java_library(**kwargs):
    native.java_library(**kwargs)

def java_binary(**kwargs):
    native.java_binary(**kwargs)
