#!/usr/bin/env bash
# Keeps README.md's figures the verbatim output of the programs that print them. A figure is a
# fenced block between the lines
#   <!-- figure: //examples:NAME -->   and   <!-- end figure -->
# and holds what `./bazelw run //examples:NAME` prints. By default this script reruns every such
# program and rewrites its block; with --check it changes nothing and fails on any difference
# (//tools:readme_figures_test runs that, so a figure and its program cannot drift apart).
# Usage: tools/update_readme_figures.sh [--check] [--readme FILE] [--bin-dir DIR]
#   --bin-dir DIR: run the programs already built under DIR (DIR/examples/NAME) instead of ./bazelw.
set -euo pipefail

check=0
readme=README.md
bin_dir=
while (( $# )); do
  case "$1" in
    --check) check=1 ;;
    --readme) readme=$2; shift ;;
    --bin-dir) bin_dir=$2; shift ;;
    *) echo "usage: $0 [--check] [--readme FILE] [--bin-dir DIR]" >&2; exit 2 ;;
  esac
  shift
done
if [[ -z "$bin_dir" ]]; then cd "$(dirname "$0")/.."; fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

targets=$(sed -n 's/^<!-- figure: \(\/\/examples:[A-Za-z0-9_]*\) -->$/\1/p' "$readme")
if [[ -z "$targets" ]]; then
  echo "$readme has no '<!-- figure: //examples:NAME -->' blocks" >&2
  exit 1
fi
for target in $targets; do
  name=${target#//examples:}
  if [[ -n "$bin_dir" ]]; then
    "$bin_dir/examples/$name" >"$work/$name.out"
  elif ! ./bazelw run "$target" >"$work/$name.out" 2>"$work/$name.log"; then
    cat "$work/$name.log" >&2
    exit 1
  fi
done

# The README with every figure block replaced by its program's fresh output.
awk -v dir="$work" '
  /^<!-- figure: \/\/examples:[A-Za-z0-9_]* -->$/ {
    print
    name = $3
    sub(/^\/\/examples:/, "", name)
    print "```"
    while ((getline line < (dir "/" name ".out")) > 0) print line
    print "```"
    skipping = 1
    next
  }
  /^<!-- end figure -->$/ { skipping = 0 }
  !skipping { print }
' "$readme" >"$work/README.new"

if (( check )); then
  if ! diff -u "$readme" "$work/README.new"; then
    echo "README figures are stale: run tools/update_readme_figures.sh and commit the result" >&2
    exit 1
  fi
  echo "README figures match their programs' output"
else
  cp "$work/README.new" "$readme"
  echo "rewrote the figures in $readme"
fi
