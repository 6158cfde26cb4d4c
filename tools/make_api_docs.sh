#!/usr/bin/env bash
# Generates the API reference (HTML) from the public headers' /// comments with Doxygen, and fails
# on any warning: an undocumented public declaration or a malformed comment.
# Usage: tools/make_api_docs.sh [OUT_DIR]   (default ./api_docs; open OUT_DIR/html/index.html)
# Installs Debian's doxygen when missing and run as root, as ./bazelw does for the build.
set -euo pipefail
out=$(realpath -m "${1:-api_docs}")  # relative to where it is run from
cd "$(dirname "$0")/.."

if ! command -v doxygen >/dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]]; then
    echo "make_api_docs: installing doxygen" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends doxygen >/dev/null
  else
    echo "make_api_docs: doxygen is missing; install it with:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends doxygen" >&2
    exit 1
  fi
fi

mkdir -p "$out"
rm -f "$out/warnings.log"
# The public headers: the two umbrella headers and what they include.
inputs=(docs/namespaces.dox ampgrad.h ampgrad_distributed.h)
for umbrella in ampgrad.h ampgrad_distributed.h; do
  while read -r header; do
    [[ "$header" == ampgrad.h ]] || inputs+=("$header")
  done < <(sed -n 's/^#include "\(.*\)"$/\1/p' "$umbrella")
done

status=0
AMPGRAD_API_DOCS_OUT=$out AMPGRAD_API_DOCS_INPUT="${inputs[*]}" doxygen docs/Doxyfile >/dev/null || status=$?
if [[ -s "$out/warnings.log" ]]; then
  cat "$out/warnings.log" >&2
  echo "make_api_docs: $(wc -l <"$out/warnings.log") warnings (every public declaration needs a /// comment)" >&2
  exit 1
fi
if (( status != 0 )); then
  echo "make_api_docs: doxygen failed (exit status $status)" >&2
  exit 1
fi
echo "make_api_docs: ${#inputs[@]} headers, no warnings; open $out/html/index.html"
