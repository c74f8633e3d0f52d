#!/usr/bin/env bash
# The main job (README): installs dependencies, builds, writes the tiny demo model, inspects
# it, starts the expert store (dsflash-expertstore, with an arena smaller than the model so
# that experts are evicted and reloaded) and dsflash-inference attached to it, streams a
# Generate to the terminal, scrapes both metrics endpoints, and stops both cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
scripts/build.sh
build=${DSF_BUILD_DIR:-build}
run=$(mktemp -d /tmp/dsflash-demo.XXXXXX)
model=${DSF_DEMO_MODEL:-$run/tiny.gguf}
metrics_port=${DSF_METRICS_PORT:-9100}
store_metrics_port=${DSF_STORE_METRICS_PORT:-9101}
sock=unix:$run/inference.sock
store_sock=unix:$run/expertstore.sock
pid=""
store_pid=""
cleanup() {
  for p in $pid $store_pid; do
    if kill -0 "$p" 2>/dev/null; then kill -TERM "$p"; wait "$p" || true; fi
  done
  rm -rf "$run"
}
trap cleanup EXIT

echo "== writing the tiny synthetic DeepSeek-V4.1 model"
"$build/tools/dsflash" mkmodel --preset tiny --seed 1 --out "$model" --no-progress
echo "== inspecting it"
"$build/tools/dsflash" inspect "$model" | sed -n '1,3p;/^configuration/,$p'
echo "== tokenizing a sentence"
"$build/tools/dsflash" tokenize --model "$model" "The expert store streams 12345 experts to the GPU, 今天 🙂"

echo "== starting dsflash-expertstore ($store_sock, 2 MiB arena, metrics on 127.0.0.1:$store_metrics_port)"
"$build/expertstore_svc/dsflash-expertstore" --model "$model" --listen "$store_sock" --budget 2M \
  --metrics "127.0.0.1:$store_metrics_port" &
store_pid=$!
for _ in $(seq 1 200); do [[ -S $run/expertstore.sock ]] && break; sleep 0.05; done
[[ -S $run/expertstore.sock ]] || { echo "dsflash-expertstore did not start" >&2; exit 1; }

echo "== starting dsflash-inference ($sock, metrics on 127.0.0.1:$metrics_port, experts from the store)"
"$build/inference_svc/dsflash-inference" --model "$model" --listen "$sock" --metrics "127.0.0.1:$metrics_port" \
  --expert-store "$store_sock" &
pid=$!
for _ in $(seq 1 200); do [[ -S $run/inference.sock ]] && break; sleep 0.05; done
[[ -S $run/inference.sock ]] || { echo "dsflash-inference did not start" >&2; exit 1; }

ready() {
  local m
  m=$(curl -fsS "http://127.0.0.1:$metrics_port/metrics" 2>/dev/null) || return 1
  grep -q '^llm_model_loaded 1' <<<"$m" && grep -q '^llm_expert_store_up 1' <<<"$m"
}
for _ in $(seq 1 200); do ready && break; sleep 0.05; done
ready || { echo "dsflash-inference did not become ready" >&2; exit 1; }

echo "== streaming a Generate (synthetic weights: the text is noise, the pipeline is real)"
"$build/tools/dsflash" generate --server "$sock" --max-tokens 48 --temperature 0.8 --seed 42 \
  "The expert store streams"
echo "== the same as a chat in thinking mode"
"$build/tools/dsflash" generate --server "$sock" --chat --thinking --effort high --max-tokens 24 --temperature 0 \
  "What is 2+2?"

echo "== scraping http://127.0.0.1:$metrics_port/metrics"
curl -fsS "http://127.0.0.1:$metrics_port/metrics" |
  grep -E '^llm_(requests_total|request_finished_total|generation_tokens_total|prompt_tokens_total|prompt_tokens_cached_total|expert_store_up|expert_fetch_seconds_count|build_info)'
echo "== scraping http://127.0.0.1:$store_metrics_port/metrics"
curl -fsS "http://127.0.0.1:$store_metrics_port/metrics" |
  grep -E '^dsflash_expertstore_(hits_total|misses_total|evictions_total|loads_total|bytes_read_total|capacity_slots|resident_slots|sessions|build_info)'

echo "== stopping (SIGTERM: drain, then exit)"
kill -TERM "$pid"
wait "$pid"
pid=""
kill -TERM "$store_pid"
wait "$store_pid"
store_pid=""
echo "== done"
