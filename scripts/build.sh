#!/usr/bin/env bash
# Configures and builds dsflash into ${DSF_BUILD_DIR:-build} (Ninja, RelWithDebInfo).
# Extra arguments go to cmake (e.g. -DDSF_ENABLE_CUDA=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${DSF_BUILD_DIR:-build}
jobs=${DSF_JOBS:-$(nproc)}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${DSF_BUILD_TYPE:-RelWithDebInfo} "$@" >/dev/null
cmake --build "$build" -j "$jobs"
