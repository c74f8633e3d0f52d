#!/usr/bin/env bash
# ctest entry for the deploy/ checks: lints the YAML (yamllint), scrapes the metrics that the
# real binaries export (both services on a tiny synthetic model, one Generate through the
# store), then runs check.mjs: render, schema-validate and cross-check the manifests.
#   run.sh DSFLASH_BIN INFERENCE_BIN EXPERTSTORE_BIN
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
dsflash=$1 inference=$2 store=$3
if [[ ! -d $here/node_modules/kubernetes-models ]]; then
  echo "tests/deploy: node_modules missing: run 'npm ci --prefix tests/deploy' (scripts/test.sh does)" >&2
  exit 1
fi
if command -v yamllint > /dev/null; then
  yamllint -c "$root/deploy/.yamllint" "$root/deploy"
  echo "yamllint: deploy/ clean"
else
  echo "yamllint not installed: YAML checked by the parser only"
fi

run=$(mktemp -d /tmp/dsf_deploy.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$run"
}
trap cleanup EXIT
trap 'echo "tests/deploy/run.sh failed at line $LINENO"; tail -n 5 "$run"/*.log 2>/dev/null' ERR
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
sm=$(free_port)
im=$(free_port)
while [[ $im == "$sm" ]]; do im=$(free_port); done
"$dsflash" mkmodel --preset tiny --out "$run/tiny.gguf" --no-progress > /dev/null
"$store" --model "$run/tiny.gguf" --listen "unix:$run/store.sock" --metrics "127.0.0.1:$sm" --budget 2M 2> "$run/store.log" &
pids+=($!)
for _ in $(seq 1 200); do [[ -S $run/store.sock ]] && break; sleep 0.05; done
"$inference" --model "$run/tiny.gguf" --listen "unix:$run/inference.sock" --metrics "127.0.0.1:$im" \
  --expert-store "unix:$run/store.sock" 2> "$run/inference.log" &
pids+=($!)
ready() {
  local m
  m=$(curl -fsS "http://127.0.0.1:$im/metrics" 2>/dev/null) || return 1
  grep -q '^llm_expert_store_up 1' <<< "$m" && grep -q '^llm_model_loaded 1' <<< "$m"
}
# The store session comes up before the model has loaded (under ASan by seconds): wait for both.
for _ in $(seq 1 1200); do ready && break; sleep 0.05; done
ready || { echo "the services did not become ready"; tail -n 5 "$run"/*.log; exit 1; }
"$dsflash" generate --server "unix:$run/inference.sock" --max-tokens 4 --temperature 0 "Hello deploy" > /dev/null
curl -fsS "http://127.0.0.1:$im/metrics" > "$run/inference.metrics"
curl -fsS "http://127.0.0.1:$sm/metrics" > "$run/store.metrics"
DSF_SOURCE_DIR=$root DSF_INFERENCE_BIN=$inference DSF_EXPERTSTORE_BIN=$store \
  DSF_METRICS_FILES="$run/inference.metrics,$run/store.metrics" node "$here/check.mjs"
