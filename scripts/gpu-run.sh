#!/usr/bin/env bash
# On the GPU machine: runs every bundled GPU test binary, logs under ${OUT:-out/gpu-logs}.
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${OUT:-out/gpu-logs}
mkdir -p "$logs"
export LD_LIBRARY_PATH=$PWD/out/gpu/lib DSF_GOLDEN_DIR=$PWD/out/gpu/golden
export DSF_EXPERTSTORE_BIN=$PWD/out/gpu/bin/dsflash-expertstore DSF_COMMIT=$(cat out/gpu/commit)
export DSF_INFERENCE_BIN=$PWD/out/gpu/bin/dsflash-inference
export DSF_MACHINE="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) test machine ($(nproc) threads, $(uname -m))"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$logs/gpu.txt" 2>&1
rc=0
# DSF_TESTS: a glob of test names to run (default all); DSF_SKIP_BENCH=1 skips the benchmarks.
for b in out/gpu/bin/${DSF_TESTS:-*}_test; do
  name=$(basename "$b")
  if "$b" > "$logs/$name.log" 2>&1; then echo "PASS $name"; else echo "FAIL $name"; rc=1; fi
  tail -3 "$logs/$name.log"
done
# Test binary T run again under one switch ENV (VAR=VALUE) with gtest FILTER, logged as
# T_test_SUFFIX.log: each mirrors a ctest entry of that name.
rerun() {
  local t=$1 env=$2 filter=$3 suffix=$4
  # shellcheck disable=SC2053  # DSF_TESTS is a glob
  [[ -x out/gpu/bin/${t}_test && ( -z ${DSF_TESTS:-} || $t == ${DSF_TESTS} ) ]] || return 0
  local log="$logs/${t}_test_${suffix}.log"
  if env "$env" "out/gpu/bin/${t}_test" --gtest_filter="$filter" > "$log" 2>&1; then
    echo "PASS ${t}_test ($env)"
  else
    echo "FAIL ${t}_test ($env)"; rc=1
  fi
  tail -3 "$log"
}
sparse='*Sparse*:*Rope*:*Window*'
# linear_cuda_test on the fp32 GEMV kernels.
rerun linear_cuda DSF_GEMV_MMA=0 '*' fp32_gemv
# The sparse attention tests and the golden model with a decode row on the split kernels (by
# default the tensor-core kernel, sparse_tc.cu, takes it).
rerun model_ops_cuda DSF_ATTN_TC=0 "$sparse" attn_split
rerun golden_cuda DSF_ATTN_TC=0 '*' attn_split
# The sparse attention tests on the tensor-core kernel in the portable cluster of 8 (by default
# the H200 takes clusters of up to 16).
rerun model_ops_cuda DSF_ATTN_TC_CLUSTER=8 "$sparse" portable_cluster
# The golden model with every index source scoring and selecting.
rerun golden_cuda DSF_INDEXER_EVERY_KEY=0 '*' indexer_full
[[ ${DSF_SKIP_BENCH:-0} == 1 ]] && exit $rc
# Benchmarks (not tests): rows for bench/results.csv.
out/gpu/bin/linear_cuda_bench "$logs/bench.csv" "$(cat out/gpu/commit)" | tee "$logs/bench.log"
# The cost of cold code (kernels of straight-line code, their code in the SM, in L2, in DRAM).
DSF_COMMIT=$(cat out/gpu/commit) out/gpu/bin/icache_bench --csv "$logs/bench.csv" | tee -a "$logs/bench.log" || rc=1
# A layer's chain of GEMVs as separate kernels against one persistent kernel (bench/chain_bench.cu).
DSF_COMMIT=$(cat out/gpu/commit) out/gpu/bin/chain_bench --csv "$logs/bench.csv" | tee -a "$logs/bench.log" || rc=1
# The model on the CUDA backend (DSF_MODEL_BENCH=1): the perf preset (released dims, 40 layers,
# every expert resident) written to this machine's disk; prefill 512 + decode 64, prefill 4096.
if [[ ${DSF_MODEL_BENCH:-0} == 1 ]]; then
  # tmpfs when it has room (the machine starts cold each session; a RAM-backed file saves the
  # disk write), else /tmp.
  perf_dir=/tmp
  shm_free_gb=$(df --output=avail -BG /dev/shm 2>/dev/null | tail -1 | tr -dc '0-9')
  [[ -w /dev/shm && ${shm_free_gb:-0} -ge 24 ]] && perf_dir=/dev/shm
  perf=${DSF_BENCH_DIR:-$perf_dir}/perf.gguf
  if [[ ! -f $perf ]]; then
    t0=$SECONDS
    out/gpu/bin/dsflash mkmodel --preset perf --out "$perf" --no-progress >> "$logs/bench.log" 2>&1 || rc=1
    echo "mkmodel perf: $((SECONDS - t0)) s" >> "$logs/bench.log"
  fi
  out/gpu/bin/dsflash bench --backend cuda --model "$perf" --label perf --prompt 512 --decode 64 \
    --runs "${DSF_BENCH_RUNS:-3}" --csv "$logs/bench.csv" >> "$logs/bench.log" 2>&1 || rc=1
  if [[ ${DSF_LONG_PREFILL:-0} == 1 ]]; then
    out/gpu/bin/dsflash bench --backend cuda --model "$perf" --label perf --prompt 4096 --decode 8 --runs 1 --warmup 0 \
      --csv "$logs/bench.csv" >> "$logs/bench.log" 2>&1 || rc=1
  fi
  tail -40 "$logs/bench.log"
fi
# Streamed experts (DSF_STREAM_BENCH=1): the perf preset with DSF_STREAM_EXPERTS experts per
# layer (default 32) and routing skew DSF_STREAM_SKEW (mkmodel --routing-skew; default 0.3, 0 =
# the random router's nearly even picks) on this machine's disk, the store with a device arena
# at 25 / 50 / 100 % (DSF_STREAM_FRACTIONS), a pinned host tier of DSF_STREAM_HOST x all experts
# (default 0: none), the store's eviction DSF_STREAM_EVICTION (default lfu).
if [[ ${DSF_STREAM_BENCH:-0} == 1 ]]; then
  n_exp=${DSF_STREAM_EXPERTS:-32}
  skew=${DSF_STREAM_SKEW:-0.3}
  # Pooled experts (mkmodel --pooled-experts): each expert tensor encodes two experts' rows and
  # copies them to the rest, ~4x faster to write on a cold machine; routing is the model's own.
  sperf=${DSF_STREAM_DIR:-/tmp}/perf-e$n_exp-s$skew-pooled.gguf
  if [[ ! -f $sperf ]]; then
    t0=$SECONDS
    out/gpu/bin/dsflash mkmodel --preset perf --experts "$n_exp" --routing-skew "$skew" --pooled-experts --out "$sperf" --no-progress \
      >> "$logs/stream.log" 2>&1 || rc=1
    echo "mkmodel perf --experts $n_exp --routing-skew $skew: $((SECONDS - t0)) s" >> "$logs/stream.log"
  fi
  for pf in ${DSF_STREAM_PREFETCH:-on off}; do
    out/gpu/bin/expert_stream_bench --model "$sperf" --store-bin "$DSF_EXPERTSTORE_BIN" --label "perf-e$n_exp-skew$skew" \
      --fractions "${DSF_STREAM_FRACTIONS:-0.25,0.5,1}" --decode "${DSF_STREAM_DECODE:-256}" \
      --prefetch "$pf" --host-cache "${DSF_STREAM_HOST:-0}" --eviction "${DSF_STREAM_EVICTION:-lfu}" --trace-out "$logs/trace-e$n_exp-s$skew.txt" --csv "$logs/bench.csv" >> "$logs/stream.log" 2>&1 || rc=1
  done
  # Eviction policies on the recorded routing (replayed through the slot table).
  out/gpu/bin/expert_cache_sim --trace "$logs/trace-e$n_exp-s$skew.txt" --csv "$logs/bench.csv" >> "$logs/stream.log" 2>&1 || rc=1
  tail -20 "$logs/stream.log"
fi
# Expert store: hit path and miss path (host and device arenas) on the mid synthetic model
# written to this machine's disk.
if [[ ${DSF_SKIP_STORE_BENCH:-0} != 1 ]]; then
  model=${DSF_BENCH_DIR:-/tmp}/mid.gguf
  [[ -f $model ]] || out/gpu/bin/dsflash mkmodel --preset mid --out "$model" --no-progress >> "$logs/bench.log" 2>&1
  for arena in host device; do
    out/gpu/bin/expertstore_bench --model "$model" --label mid --store-bin "$DSF_EXPERTSTORE_BIN" --runs 5 \
      --threads 4 --arena $arena --csv "$logs/bench.csv" >> "$logs/bench.log" 2>&1 || rc=1
  done
  tail -20 "$logs/bench.log"
fi
exit $rc
