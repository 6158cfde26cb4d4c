"""unit_test: a GoogleTest cc_test for tests/NAME.cc with its own dependencies (and environment).

test_name runs the same file as another test (e.g. under a different environment)."""

def unit_test(name, deps, data = [], size = "medium", tags = [], env = {}, test_name = None):
    native.cc_test(
        name = test_name or name,
        size = size,
        srcs = [name + ".cc"],
        data = data,
        env = env,
        tags = tags,
        deps = deps + ["@gtest//:gtest_main"],
    )
