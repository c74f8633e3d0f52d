#!/usr/bin/env bash
# Sanitizer builds (issue 9), run by scripts/test.sh after the ordinary suite:
#  - ASan + UBSan (clang, no CUDA) of the whole project, with the libFuzzer targets, then the
#    whole test suite in it (GPU tests skip; any sanitizer report fails the test);
#  - TSan (clang) of the concurrency tests (ctest label "concurrency": scheduler, slot table,
#    store sessions and leases).
# Build folders: ${DSF_ASAN_DIR:-build-asan}, ${DSF_TSAN_DIR:-build-tsan}.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${DSF_JOBS:-$(nproc)}
asan=${DSF_ASAN_DIR:-build-asan}
tsan=${DSF_TSAN_DIR:-build-tsan}
common=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSF_ENABLE_CUDA=OFF
        -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++)

echo "== ASan + UBSan build ($asan)"
cmake -S . -B "$asan" "${common[@]}" -DDSF_SANITIZE_ADDRESS=ON -DDSF_SANITIZE_UNDEFINED=ON -DDSF_FUZZ=ON > /dev/null
cmake --build "$asan" -j "$jobs"
echo "== ASan + UBSan: the test suite"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ctest --test-dir "$asan" --output-on-failure -j "$jobs" -LE gpu

echo "== TSan build of the concurrency tests ($tsan)"
cmake -S . -B "$tsan" "${common[@]}" -DDSF_SANITIZE_THREAD=ON > /dev/null
# dsf_test names each test after its executable target (the tree is not built yet, so ctest
# does not know the commands).
targets=$(ctest --test-dir "$tsan" -L concurrency --show-only=json-v1 | python3 -c '
import json, sys
print(" ".join(sorted({t["name"] for t in json.load(sys.stdin)["tests"]})))')
cmake --build "$tsan" -j "$jobs" --target $targets
echo "== TSan: $targets"
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 ctest --test-dir "$tsan" --output-on-failure -j "$jobs" -L concurrency
