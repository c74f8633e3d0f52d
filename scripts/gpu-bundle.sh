#!/usr/bin/env bash
# Builds the GPU tests here and bundles them (binaries, their shared libraries, the golden
# model, the store binaries and benchmarks) into out/gpu, stripped, and out/gpu.tar.xz (what
# travels to the H200 test machine, where scripts/gpu-run.sh runs them).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh -DDSF_ENABLE_CUDA=ON
build=${DSF_BUILD_DIR:-build}
rm -rf out/gpu
bins=$(ctest --test-dir "$build" -L gpu --show-only=json-v1 | python3 -c '
import json, sys
for t in json.load(sys.stdin)["tests"]:
    print(t["command"][0])' | sort -u)
../shared/tools/device-bundle out/gpu $bins "$build/tests/linear_cuda_bench" "$build/tests/icache_bench" "$build/tests/chain_bench" \
  "$build/expertstore_svc/dsflash-expertstore" "$build/tools/dsflash" "$build/tools/expertstore_bench" "$build/tools/expert_stream_bench" "$build/tools/expert_cache_sim" "$build/tools/sampler_bench" "$build/inference_svc/dsflash-inference"
# The commit the rows of its benchmarks carry: "-dirty" where the tree had changes not committed.
echo "$(git rev-parse --short=7 HEAD)$(git diff --quiet HEAD -- || echo -dirty)" > out/gpu/commit
mkdir -p out/gpu/golden
cp ../shared/golden/tiny_a.gguf ../shared/golden/tiny_a_golden.safetensors out/gpu/golden/
strip --strip-unneeded out/gpu/bin/* out/gpu/lib/* 2>/dev/null || true
tar -C out -cJf out/gpu.tar.xz gpu
echo "bundle: out/gpu ($(du -sh out/gpu | cut -f1)), out/gpu.tar.xz ($(du -sh out/gpu.tar.xz | cut -f1));"
echo "carry out/gpu.tar.xz and run there: tar -C out -xJf out/gpu.tar.xz && scripts/gpu-run.sh"
