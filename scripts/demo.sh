#!/usr/bin/env bash
# The main job (README): installs dependencies, builds, writes the tiny demo model, inspects
# it, starts dsflash-inference on it, streams a Generate to the terminal, scrapes the metrics
# endpoint, and stops the service cleanly (SIGTERM drain). The expert store joins when its
# issue lands; until then the inference service reads experts in-process.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
scripts/build.sh
build=${DSF_BUILD_DIR:-build}
run=$(mktemp -d /tmp/dsflash-demo.XXXXXX)
model=${DSF_DEMO_MODEL:-$run/tiny.gguf}
metrics_port=${DSF_METRICS_PORT:-9100}
sock=unix:$run/inference.sock
pid=""
cleanup() {
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid"; wait "$pid" || true; fi
  rm -rf "$run"
}
trap cleanup EXIT

echo "== writing the tiny synthetic DeepSeek-V4.1 model"
"$build/tools/dsflash" mkmodel --preset tiny --seed 1 --out "$model" --no-progress
echo "== inspecting it"
"$build/tools/dsflash" inspect "$model" | sed -n '1,3p;/^configuration/,$p'
echo "== tokenizing a sentence"
"$build/tools/dsflash" tokenize --model "$model" "The expert store streams 12345 experts to the GPU, 今天 🙂"

echo "== starting dsflash-inference ($sock, metrics on 127.0.0.1:$metrics_port)"
"$build/inference_svc/dsflash-inference" --model "$model" --listen "$sock" --metrics "127.0.0.1:$metrics_port" &
pid=$!
for _ in $(seq 1 200); do [[ -S $run/inference.sock ]] && break; sleep 0.05; done
[[ -S $run/inference.sock ]] || { echo "dsflash-inference did not start" >&2; exit 1; }

echo "== streaming a Generate (synthetic weights: the text is noise, the pipeline is real)"
"$build/tools/dsflash" generate --server "$sock" --max-tokens 48 --temperature 0.8 --seed 42 \
  "The expert store streams"
echo "== the same as a chat in thinking mode"
"$build/tools/dsflash" generate --server "$sock" --chat --thinking --effort high --max-tokens 24 --temperature 0 \
  "What is 2+2?"

echo "== scraping http://127.0.0.1:$metrics_port/metrics"
curl -fsS "http://127.0.0.1:$metrics_port/metrics" | grep -E '^llm_(requests_total|request_finished_total|generation_tokens_total|prompt_tokens_total|build_info)'

echo "== stopping (SIGTERM: drain, then exit)"
kill -TERM "$pid"
wait "$pid"
pid=""
echo "== done"
