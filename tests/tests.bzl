"""unit_test: a GoogleTest cc_test for tests/NAME.cc with its own dependencies (and environment)."""

def unit_test(name, deps, data = [], size = "medium", tags = [], env = {}):
    native.cc_test(
        name = name,
        size = size,
        srcs = [name + ".cc"],
        data = data,
        env = env,
        tags = tags,
        deps = deps + ["@gtest//:gtest_main"],
    )
