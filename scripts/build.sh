#!/usr/bin/env bash
# Configures and builds mlajit into build/ (Release).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
