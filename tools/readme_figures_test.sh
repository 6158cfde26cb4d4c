#!/usr/bin/env bash
# Fails when a README figure differs from what its program prints now (see update_readme_figures.sh).
set -euo pipefail
exec tools/update_readme_figures.sh --check --readme README.md --bin-dir .
