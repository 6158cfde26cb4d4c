#!/usr/bin/env bash
# Installs ampgrad into a temporary prefix (`bazel run //:install -- PREFIX`), then builds and runs
# the seed program against it twice, as a project without Bazel would: through the CMake package
# (find_package(ampgrad), this folder's CMakeLists.txt) and through pkg-config with a bare g++.
set -euo pipefail
cd "$(dirname "$0")/../.."

work=$(mktemp -d "${TMPDIR:-/tmp}/ampgrad_install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

./bazelw run --noshow_progress //:install -- "$prefix"

check_seed() {
  local how=$1 out
  out=$("$2")
  echo "$how: $out"
  if ! grep -Eq '^device (cpu|cuda) loss [0-9]+\.[0-9]+ ' <<<"$out"; then
    echo "install consumer ($how): the seed program printed no loss" >&2
    exit 1
  fi
}

cmake -S tests/cmake_consumer -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/build" -j 2 >/dev/null
check_seed cmake "$work/build/seed"

# shellcheck disable=SC2046  # pkg-config's flags are meant to split
g++ -O2 tests/consumer/main.cc -o "$work/seed_pkgconfig" \
  $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs ampgrad)
check_seed pkg-config "$work/seed_pkgconfig"
