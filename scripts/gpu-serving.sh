#!/usr/bin/env bash
# On the GPU machine, from a bundle (scripts/gpu-bundle.sh): the serving benchmark through the
# API (`dsflash loadgen`) against dsflash-inference on the CUDA backend, once per --prefix-copy
# setting in COPIES (default "think all"): fresh prompts, the same prompt again, and a
# thinking-mode conversation (turns ending with <think>), one client each; then, once per
# --max-running setting in RUNNING (default "1 4"), fresh prompts from CLIENTS clients (2) at
# once. Rows (benchmark "serving") to CSV, logs under ${OUT:-out/gpu-logs}.
#   scripts/gpu-serving.sh CSV
# Environment: MODEL (default: the perf preset with pooled experts in /dev/shm, written once),
# PROMPT (512), TOKENS (32), REQUESTS (8), COPIES ("think all"), RUNNING ("1 4"), CLIENTS (2),
# BACKEND (cuda).
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
pid=
# A server with the given flags (log serving-server-NAME.log); loadgen waits for it to load.
serve() {
  local name=$1
  shift
  rm -f "$sock"
  "$bin/dsflash-inference" --model "$model" --backend "${BACKEND:-cuda}" --listen "unix:$sock" --metrics 127.0.0.1:9190 \
    --max-new-tokens 1024 "$@" > "$logs/serving-server-$name.log" 2>&1 &
  pid=$!
}
stop() {
  kill -TERM "$pid"
  wait "$pid"
}
run() {
  local label=$1
  shift
  "$bin/dsflash" loadgen --server "unix:$sock" --requests "${REQUESTS:-8}" --prompt-tokens "${PROMPT:-512}" \
    --max-tokens "${TOKENS:-32}" --wait-ready 300 --csv "$csv" --label "perf-pooled $label" "$@" \
    >> "$logs/serving.log" 2>&1 || { echo "gpu-serving: loadgen $* failed ($label)" >&2; rc=1; }
}
for copy in ${COPIES:-think all}; do
  serve "$copy" --prefix-copy "$copy"
  echo "== prefix-copy $copy" >> "$logs/serving.log"
  run "prefix-copy=$copy" --mode fresh  # the first request also warms the server (graphs, allocator pools)
  run "prefix-copy=$copy" --mode same
  run "prefix-copy=$copy" --mode turns --think --turn-tokens 64
  stop
done
clients=${CLIENTS:-2}
for running in ${RUNNING:-1 4}; do
  serve "running$running" --max-running "$running"
  echo "== max-running $running, $clients clients" >> "$logs/serving.log"
  run "max-running=$running warm-up" --mode fresh --requests 1
  run "max-running=$running" --mode fresh --concurrency "$clients" --requests $((4 * clients))
  stop
done
grep -E "^== |ttft_ms_p50|ttft_ms_p99|tpot_ms_p50|output_tokens_per_s|cached_prompt_share" "$logs/serving.log"
exit $rc
