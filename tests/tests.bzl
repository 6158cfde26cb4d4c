"""unit_test: a GoogleTest cc_test for tests/NAME.cc with its own dependencies (and environment).

test_name runs the same file as another test (e.g. under a different environment)."""

def unit_test(name, deps, data = [], size = "medium", tags = [], env = {}, test_name = None, extra_srcs = []):
    native.cc_test(
        name = test_name or name,
        size = size,
        srcs = [name + ".cc"] + extra_srcs,
        data = data,
        env = env,
        tags = tags,
        deps = deps + ["@gtest//:gtest_main"],
    )

def mpi_test(name, deps, ranks = [2, 4], size = "medium", tags = []):
    """tests/NAME.cc as an MPI job: NAME_bin, and one sh_test NAME_npN per entry of `ranks`.

    The binary runs under mpirun (tests/mpirun_test.sh) with tests/mpi_gtest_main.cc as main().
    """
    native.cc_binary(
        name = name + "_bin",
        testonly = True,
        srcs = [name + ".cc"],
        deps = deps + [":mpi_gtest_main"],
    )
    for n in ranks:
        native.sh_test(
            name = "%s_np%d" % (name, n),
            size = size,
            srcs = ["mpirun_test.sh"],
            args = [str(n), "$(location :%s_bin)" % name],
            data = [":%s_bin" % name],
            tags = tags,
        )
