#!/usr/bin/env bash
# The test command (README): installs dependencies, builds, runs every test with ctest, then
# the sanitizer builds and suites and a bounded fuzzing run. GPU tests skip themselves where
# no GPU is present. Extra arguments go to the first ctest (e.g. -L unit); DSF_QUICK=1 stops
# after it.
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
[[ ${DSF_QUICK:-0} == 1 ]] && exit 0
# Sanitizers (ASan + UBSan over the whole suite, TSan over the concurrency tests) and a
# bounded libFuzzer run of every target (their builds: build-asan, build-tsan).
scripts/sanitize.sh
DSF_FUZZ_SECONDS=${DSF_FUZZ_SECONDS:-30} scripts/fuzz.sh
