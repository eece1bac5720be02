#!/usr/bin/env bash
# The test command: builds mlajit and runs every suite through CTest. Without a GPU the GPU suite
# reports itself as skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure
