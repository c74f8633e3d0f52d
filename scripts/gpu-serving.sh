#!/usr/bin/env bash
# On the GPU machine, from a bundle (scripts/gpu-bundle.sh): the serving benchmark through the
# API (`dsflash loadgen`) against dsflash-inference on the CUDA backend, once per --prefix-copy
# setting in COPIES (default "think all"): fresh prompts, the same prompt again, and a
# thinking-mode conversation (turns ending with <think>), one client each. Rows (benchmark
# "serving") to CSV, logs under ${OUT:-out/gpu-logs}.
#   scripts/gpu-serving.sh CSV
# Environment: MODEL (default: the perf preset with pooled experts in /dev/shm, written once),
# PROMPT (512), TOKENS (32), REQUESTS (8), COPIES ("think all").
set -uo pipefail
cd "$(dirname "$0")/.."
csv=${1:?usage: scripts/gpu-serving.sh CSV}
logs=${OUT:-out/gpu-logs}
mkdir -p "$logs"
bin=out/gpu/bin
[[ -d out/gpu/lib ]] && export LD_LIBRARY_PATH=$PWD/out/gpu/lib
[[ -f out/gpu/commit ]] && export DSF_COMMIT=${DSF_COMMIT:-$(cat out/gpu/commit)}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
[[ -n $gpu ]] && export DSF_MACHINE=${DSF_MACHINE:-"$gpu test machine ($(nproc) threads, $(uname -m))"}
model=${MODEL:-/dev/shm/perf.gguf}
if [[ ! -f $model ]]; then
  "$bin/dsflash" mkmodel --preset perf --pooled-experts --out "$model" --no-progress > "$logs/serving-mkmodel.log" 2>&1 ||
    { echo "gpu-serving: mkmodel failed" >&2; exit 1; }
fi
sock=/tmp/dsf-serving.sock
rc=0
for copy in ${COPIES:-think all}; do
  rm -f "$sock"
  "$bin/dsflash-inference" --model "$model" --backend cuda --listen "unix:$sock" --metrics 127.0.0.1:9190 \
    --prefix-copy "$copy" --max-new-tokens 1024 > "$logs/serving-server-$copy.log" 2>&1 &
  pid=$!
  for _ in $(seq 240); do [[ -S $sock ]] && break; sleep 0.5; done
  [[ -S $sock ]] || { echo "gpu-serving: the server did not start (see serving-server-$copy.log)" >&2; kill $pid; exit 1; }
  run() {
    "$bin/dsflash" loadgen --server "unix:$sock" --requests "${REQUESTS:-8}" --prompt-tokens "${PROMPT:-512}" \
      --max-tokens "${TOKENS:-32}" --wait-ready 300 --csv "$csv" --label "perf-pooled prefix-copy=$copy" "$@" \
      >> "$logs/serving.log" 2>&1 || { echo "gpu-serving: loadgen $* failed (copy $copy)" >&2; rc=1; }
  }
  echo "== prefix-copy $copy" >> "$logs/serving.log"
  run --mode fresh  # the first request also warms the server (graphs, allocator pools)
  run --mode same
  run --mode turns --think --turn-tokens 64
  kill -TERM $pid
  wait $pid
done
grep -E "^== |ttft_ms_p50|tpot_ms_p50|cached_prompt_share" "$logs/serving.log"
exit $rc
