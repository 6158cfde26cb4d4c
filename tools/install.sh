#!/usr/bin/env bash
# Installs ampgrad for projects that do not build with Bazel:
#   ./bazelw run //:install -- PREFIX
# puts the headers under PREFIX/include/ampgrad, libampgrad.a (ampgrad and every static library
# behind it) in PREFIX/lib, ampgrad.pc in PREFIX/lib/pkgconfig and the CMake package (target
# ampgrad::ampgrad) in PREFIX/lib/cmake/ampgrad. The installed tree is relocatable.
set -euo pipefail

if (( $# != 1 )); then
  echo "usage: bazel run //:install -- PREFIX" >&2
  exit 2
fi
prefix=$1
# bazel run starts this script in its runfiles tree: a relative PREFIX is the caller's.
if [[ "$prefix" != /* ]]; then prefix="${BUILD_WORKING_DIRECTORY:-$PWD}/$prefix"; fi

# The bundle's files, wherever the runfiles tree put them (bazel run, or the script run by hand).
runfiles="${RUNFILES_DIR:-$0.runfiles}/ampgrad"
[[ -d "$runfiles" ]] || runfiles=$PWD
bundle="$runfiles/install_bundle"
if [[ ! -f "$bundle/headers.txt" ]]; then
  echo "install: the bundle is not in $runfiles; run it as 'bazel run //:install -- PREFIX'" >&2
  exit 1
fi

include="$prefix/include/ampgrad"
mkdir -p "$include" "$prefix/lib/pkgconfig" "$prefix/lib/cmake/ampgrad"
while read -r header; do
  [[ -n "$header" ]] || continue
  install -D -m 644 "$runfiles/$header" "$include/$header"
done <"$bundle/headers.txt"
install -m 644 "$bundle/libampgrad.a" "$prefix/lib/libampgrad.a"
install -m 644 "$bundle/ampgrad.pc" "$prefix/lib/pkgconfig/ampgrad.pc"
install -m 644 "$bundle/ampgradConfig.cmake" "$bundle/ampgradConfigVersion.cmake" "$prefix/lib/cmake/ampgrad/"
echo "installed ampgrad into $prefix ($(wc -l <"$bundle/headers.txt") headers, lib/libampgrad.a," \
  "lib/pkgconfig/ampgrad.pc, lib/cmake/ampgrad)"
