#!/usr/bin/env bash
# The test command: builds mlajit and runs every suite through CTest. Without a GPU the GPU suite
# reports itself as skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
# No references to the history of the work in tracked files (fast: one git grep).
scripts/check_history.sh
scripts/build.sh
ctest --test-dir build --output-on-failure
# The installed package: CMake config, pkg-config, shared/static consumers, exported symbols.
scripts/test_install.sh build
# The Python package: pip install into a venv, its tests (torch tests skip visibly without torch).
scripts/test_python.sh
