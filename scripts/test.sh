#!/usr/bin/env bash
# The test command (README): installs dependencies, builds, runs every test with ctest.
# GPU tests skip themselves where no GPU is present. Extra arguments go to ctest
# (e.g. -L unit).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
scripts/build.sh
# The deploy/ checks' npm packages (Kubernetes schemas, a YAML parser), pinned by the lock file.
if [[ ! -d tests/deploy/node_modules/kubernetes-models ]]; then
  npm ci --prefix tests/deploy --no-audit --no-fund --loglevel=error
fi
build=${DSF_BUILD_DIR:-build}
ctest --test-dir "$build" --output-on-failure -j "${DSF_JOBS:-$(nproc)}" "$@"
