#!/usr/bin/env bash
# The main job: builds mlajit, compiles the default kernel set (examples/deepseek_v32.json) into
# cache/, and, when a GPU is present, runs every op once on random data against the CPU reference.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
config="${1:-examples/deepseek_v32.json}"
chmod 700 cache 2>/dev/null || true
build/mlajit build "$config" --cache-dir cache
build/mlajit check "$config" --cache-dir cache
