#!/usr/bin/env bash
# Installs the Python package from this checkout into a fresh venv (pip install ./python: an
# isolated build through scikit-build-core + CMake, as a user would) and runs python/tests.
# Tests that need torch, matplotlib, NVRTC or a GPU skip visibly (pytest -rs lists why).
# Prints the install time. Usage: scripts/test_python.sh [venv-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(realpath -m "${1:-build/pyvenv}")
python3 -m venv --help >/dev/null 2>&1 || { echo "python3 venv module missing (Debian: python3-venv)" >&2; exit 1; }
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
"$venv/bin/python" -m pip install -q pytest
# ccache keeps CI's repeated package builds cheap; the wheel is the same without it.
if command -v ccache >/dev/null; then export CMAKE_ARGS="${CMAKE_ARGS:-} -DCMAKE_CXX_COMPILER_LAUNCHER=ccache"; fi
# scripts/test.sh has just built build/libmlajit.so from this tree: reuse it (CI's time budget)
# unless MLAJIT_PY_FROM_SOURCE=1 asks for the full build a user's `pip install ./python` does.
settings=()
if [ "${MLAJIT_PY_FROM_SOURCE:-0}" != 1 ] && [ -f build/libmlajit.so ]; then
  settings=(--config-settings=cmake.define.MLAJIT_PREBUILT_LIBRARY="$PWD/build/libmlajit.so")
  # and its packaged cache layer (cmake/prebuilt_cache.cmake), when this machine could build one
  if [ -d build/prebuilt-cache-stage ]; then
    settings+=(--config-settings=cmake.define.MLAJIT_PREBUILT_CACHE_DIR="$PWD/build/prebuilt-cache-stage")
  fi
fi
start=$(date +%s)
"$venv/bin/python" -m pip install -q "${settings[@]}" ./python
echo "python package: pip install ./python took $(( $(date +%s) - start )) s${settings:+ (prebuilt build/libmlajit.so)}"
# Run from outside the source tree so that the installed package (with its libmlajit.so) is tested.
cd python/tests
"$venv/bin/python" -m pytest -q -rs .
