#!/usr/bin/env bash
# Installs build/ into a temporary prefix and builds examples/cpp_consumer against it (CMake
# package, shared and static library, a C program, pkg-config), then checks the shared library's
# exports. Usage: scripts/test_install.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S examples/cpp_consumer -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer" -j"$(nproc)" >/dev/null
for exe in consumer_shared consumer_static consumer_c; do
  "$tmp/consumer/$exe"
done
# The shared consumer must have used the installed library, by its versioned SONAME. (ldd's output
# is captured first: with pipefail, `ldd | grep -q` fails whenever grep exits before ldd has
# written everything, which made this check flaky.)
deps=$(ldd "$tmp/consumer/consumer_shared")
grep -q "libmlajit.so.0 => $tmp/prefix" <<<"$deps" ||
  { echo "consumer_shared does not load the installed libmlajit.so.0:" >&2; echo "$deps" >&2; exit 1; }
# pkg-config: a C program against the static library.
PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --exists mlajit
cc -o "$tmp/pc_c" examples/cpp_consumer/main.c $(PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --cflags mlajit) \
  "$tmp/prefix/lib/libmlajit.a" $(PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --static --libs-only-l mlajit | sed 's/-lmlajit//')
"$tmp/pc_c"
# Symbol hygiene: only mlajit_* and mlajit:: are exported (no libstdc++, fmt or nlohmann).
leaked=$(nm -D --defined-only "$tmp/prefix/lib/libmlajit.so" | awk '{ print $3 }' | sed 's/@.*//' |
         grep -v -E '^(mlajit_|_ZN6mlajit|_ZNK6mlajit|_ZT[VIS]N6mlajit|MLAJIT_0$)' || true)
if [ -n "$leaked" ]; then echo "libmlajit.so exports non-API symbols:" >&2; echo "$leaked" | head -20 >&2; exit 1; fi
"$tmp/prefix/bin/mlajit" --version >/dev/null 2>&1 || "$tmp/prefix/bin/mlajit" help >/dev/null
echo "install test: ok ($(nm -D --defined-only "$tmp/prefix/lib/libmlajit.so" | wc -l) exported symbols)"
