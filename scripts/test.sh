#!/usr/bin/env bash
# The test command (README): installs dependencies, builds, runs every test with ctest.
# GPU tests skip themselves where no GPU is present. Extra arguments go to ctest
# (e.g. -L unit).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
scripts/build.sh
build=${DSF_BUILD_DIR:-build}
ctest --test-dir "$build" --output-on-failure -j "${DSF_JOBS:-$(nproc)}" "$@"
