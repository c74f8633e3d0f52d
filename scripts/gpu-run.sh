#!/usr/bin/env bash
# On the GPU machine: runs every bundled GPU test binary, logs under ${OUT:-out/gpu-logs}.
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${OUT:-out/gpu-logs}
mkdir -p "$logs"
export LD_LIBRARY_PATH=$PWD/out/gpu/lib DSF_GOLDEN_DIR=$PWD/out/gpu/golden
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$logs/gpu.txt" 2>&1
rc=0
for b in out/gpu/bin/*_test; do
  name=$(basename "$b")
  if "$b" > "$logs/$name.log" 2>&1; then echo "PASS $name"; else echo "FAIL $name"; rc=1; fi
  tail -3 "$logs/$name.log"
done
# Benchmarks (not tests): rows for bench/results.csv.
out/gpu/bin/linear_cuda_bench "$logs/bench.csv" "$(cat out/gpu/commit)" | tee "$logs/bench.log"
exit $rc
