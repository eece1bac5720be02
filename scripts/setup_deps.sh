#!/usr/bin/env bash
# Installs the Debian packages mlajit needs to build, if any is missing (run as root on a fresh
# machine; a no-op when everything is there). The CUDA toolkit is expected at /usr/local/cuda or on
# PATH for NVRTC at run time; building needs no CUDA at all.
set -euo pipefail
need=()
dpkg -s cmake >/dev/null 2>&1 || command -v cmake >/dev/null || need+=(cmake)
command -v g++ >/dev/null || need+=(g++)
command -v make >/dev/null || need+=(make)
# The Python package (scripts/test_python.sh) needs python3 with venv and pip.
command -v python3 >/dev/null || need+=(python3)
python3 -c "import venv, ensurepip" >/dev/null 2>&1 || need+=(python3-venv python3-pip)
command -v clang++ >/dev/null || need+=(clang)  # scripts/fuzz.sh (libFuzzer, CI)
# libhiredis-dev: the remote cache's Redis client (linked statically); redis-server: the remote
# cache test suite starts one on a loopback port (it reports itself skipped without it).
for p in libfmt-dev nlohmann-json3-dev doctest-dev libhiredis-dev redis-server; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
