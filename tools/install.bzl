"""cc_install_bundle: a cc_library with everything behind it, as a non-Bazel project consumes it.

The rule gathers, from the library's CcInfo:
  - one static archive of every static library it links (the project's own and any external
    prebuilt one, such as the CUDA runtime), merged with the toolchain's `ar`;
  - the project's own headers (generated ones included), listed in a manifest for the installer;
  - the defines and link flags a consumer must use, written into a pkg-config file and a CMake
    package config. Both locate the install prefix from their own path, so the tree is relocatable.
tools/install.sh copies it all under a prefix (`bazel run //:install -- PREFIX`).
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

def _static_archive(lib):
    return lib.static_library or lib.pic_static_library

def _cc_install_bundle_impl(ctx):
    info = ctx.attr.library[CcInfo]
    name = ctx.attr.library_name

    archives = []
    objects = []
    link_flags = []
    for linker_input in info.linking_context.linker_inputs.to_list():
        for flag in linker_input.user_link_flags:
            if flag not in link_flags:
                link_flags.append(flag)
        for lib in linker_input.libraries:
            archive = _static_archive(lib)
            if archive != None:
                archives.append(archive)
            elif lib.objects:
                objects.extend(lib.objects)
            elif lib.dynamic_library != None:
                fail("%s: %s is only a shared library; an installed static archive cannot carry it" %
                     (ctx.label, lib.dynamic_library.path))

    # `ar -M` reads an MRI script: the archives' members and the loose objects, into one archive.
    lib = ctx.actions.declare_file("%s/lib%s.a" % (ctx.label.name, name))
    script = ctx.actions.declare_file("%s/lib%s.mri" % (ctx.label.name, name))
    lines = ["CREATE " + lib.path]
    lines += ["ADDLIB " + a.path for a in archives]
    lines += ["ADDMOD " + o.path for o in objects]
    lines += ["SAVE", "END", ""]
    ctx.actions.write(script, "\n".join(lines))
    cc_toolchain = find_cpp_toolchain(ctx)
    ctx.actions.run_shell(
        inputs = depset([script] + archives + objects, transitive = [cc_toolchain.all_files]),
        outputs = [lib],
        command = '"%s" -M < "%s"' % (cc_toolchain.ar_executable, script.path),
        mnemonic = "MergeArchives",
        progress_message = "Merging %d archives into %s" % (len(archives), lib.short_path),
    )

    headers = [h for h in info.compilation_context.headers.to_list() if h.owner.workspace_name == ""]
    manifest = ctx.actions.declare_file("%s/headers.txt" % ctx.label.name)
    ctx.actions.write(manifest, "\n".join([h.short_path for h in headers]) + "\n")

    defines = info.compilation_context.defines.to_list()
    cflags = ["-std=c++20"] + ["-D" + d for d in defines]
    libs = ["-l" + name] + link_flags
    pc = ctx.actions.declare_file("%s/%s.pc" % (ctx.label.name, name))
    ctx.actions.write(pc, "\n".join([
        "prefix=${pcfiledir}/../..",
        "includedir=${prefix}/include/" + name,
        "libdir=${prefix}/lib",
        "",
        "Name: " + name,
        "Description: " + ctx.attr.description,
        "Version: " + ctx.attr.version,
        "Cflags: -I${includedir} " + " ".join(cflags),
        "Libs: -L${libdir} " + " ".join(libs),
        "",
    ]))

    # CMake: an imported target NAME::NAME carrying the include path, defines, C++20 and link flags.
    cmake = ctx.actions.declare_file("%s/%sConfig.cmake" % (ctx.label.name, name))
    ctx.actions.write(cmake, "\n".join([
        "# %s's CMake package: find_package(%s REQUIRED), then link %s::%s." % (name, name, name, name),
        "get_filename_component(_%s_prefix \"${CMAKE_CURRENT_LIST_DIR}/../../..\" ABSOLUTE)" % name,
        "if(NOT TARGET %s::%s)" % (name, name),
        "  add_library(%s::%s STATIC IMPORTED)" % (name, name),
        "  set_target_properties(%s::%s PROPERTIES" % (name, name),
        "    IMPORTED_LOCATION \"${_%s_prefix}/lib/lib%s.a\"" % (name, name),
        "    INTERFACE_INCLUDE_DIRECTORIES \"${_%s_prefix}/include/%s\"" % (name, name),
        "    INTERFACE_COMPILE_DEFINITIONS \"%s\"" % ";".join(defines),
        "    INTERFACE_COMPILE_FEATURES cxx_std_20",
        "    INTERFACE_LINK_OPTIONS \"%s\")" % ";".join(link_flags),
        "endif()",
        "unset(_%s_prefix)" % name,
        "",
    ]))
    version = ctx.actions.declare_file("%s/%sConfigVersion.cmake" % (ctx.label.name, name))
    ctx.actions.write(version, "\n".join([
        "set(PACKAGE_VERSION \"%s\")" % ctx.attr.version,
        "if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)",
        "  set(PACKAGE_VERSION_COMPATIBLE FALSE)",
        "else()",
        "  set(PACKAGE_VERSION_COMPATIBLE TRUE)",
        "  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)",
        "    set(PACKAGE_VERSION_EXACT TRUE)",
        "  endif()",
        "endif()",
        "",
    ]))

    outputs = [lib, manifest, pc, cmake, version]
    return [DefaultInfo(
        files = depset(outputs),
        runfiles = ctx.runfiles(files = outputs + headers),
    )]

cc_install_bundle = rule(
    implementation = _cc_install_bundle_impl,
    attrs = {
        "library": attr.label(providers = [CcInfo], mandatory = True),
        "library_name": attr.string(mandatory = True),
        "version": attr.string(mandatory = True),
        "description": attr.string(default = ""),
        "_cc_toolchain": attr.label(default = Label("@bazel_tools//tools/cpp:current_cc_toolchain")),
    },
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
    incompatible_use_toolchain_transition = True,
)
