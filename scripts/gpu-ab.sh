#!/usr/bin/env bash
# On the GPU machine, from a bundle (scripts/gpu-bundle.sh): interleaved A/B runs of the decode
# benchmark under environment switches, so that a change's effect is read against runs of the
# same machine and minutes (the H200 test machine differs by ~0.1 ms a step from one start to
# the next). Each variant is `base` (no switch) or VAR=VALUE[,VAR=VALUE...]; the list runs
# ROUNDS times in turn, every run `dsflash bench` with RUNS runs of DECODE steps after a PROMPT
# prompt, its rows appended to CSV (bench/results.csv format, the label "LABEL VARIANT") and the
# medians (decode tok/s, graph step ms) tabulated at the end.
#   scripts/gpu-ab.sh CSV VARIANT...
# Environment: MODEL (default: the perf preset with pooled experts, written to /dev/shm once),
# BACKEND (cuda), PROMPT (64), DECODE (64), RUNS (3), ROUNDS (2), LABEL (perf-pooled),
# DSF_BIN (out/gpu/bin/dsflash). Logs under ${OUT:-out/gpu-logs}. A variant DSF_BIN=PATH runs
# another build; its rows take the commit in PATH.commit where there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
csv=${1:?usage: scripts/gpu-ab.sh CSV VARIANT...}
shift
(($# > 0)) || { echo "gpu-ab: no variants (base or VAR=VALUE[,VAR=VALUE...])" >&2; exit 2; }
for v in "$@"; do
  [[ $v == base || $v =~ ^[A-Z_][A-Z0-9_]*=[^,]*(,[A-Z_][A-Z0-9_]*=[^,]*)*$ ]] ||
    { echo "gpu-ab: variant '$v' is neither base nor VAR=VALUE[,VAR=VALUE...]" >&2; exit 2; }
done
logs=${OUT:-out/gpu-logs}
mkdir -p "$logs"
bin=${DSF_BIN:-out/gpu/bin/dsflash}
[[ -x $bin ]] || { echo "gpu-ab: no $bin (unpack the bundle first)" >&2; exit 1; }
[[ -d out/gpu/lib ]] && export LD_LIBRARY_PATH=$PWD/out/gpu/lib
if [[ -f out/gpu/commit ]]; then export DSF_COMMIT=${DSF_COMMIT:-$(cat out/gpu/commit)}; fi
# The machine column of the rows, as scripts/gpu-run.sh names it.
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
[[ -n $gpu ]] && export DSF_MACHINE=${DSF_MACHINE:-"$gpu test machine ($(nproc) threads, $(uname -m))"}
model=${MODEL:-/dev/shm/perf.gguf}
if [[ ! -f $model ]]; then
  [[ -z ${MODEL:-} ]] || { echo "gpu-ab: no model $model" >&2; exit 1; }
  "$bin" mkmodel --preset perf --pooled-experts --out "$model" --no-progress > "$logs/ab-mkmodel.log" 2>&1
fi
log=$logs/ab.log
: > "$log"
for ((round = 1; round <= ${ROUNDS:-2}; ++round)); do
  for v in "$@"; do
    envs=()
    [[ $v == base ]] || IFS=, read -r -a envs <<< "$v"
    run_bin=$bin  # DSF_BIN=PATH in a variant: another build of dsflash (a code change against its base)
    for e in "${envs[@]}"; do [[ $e == DSF_BIN=* ]] && run_bin=${e#DSF_BIN=}; done
    # Its rows carry its own commit where PATH.commit names it (scripts/gpu-pack.sh writes one).
    commit_env=()
    [[ $run_bin != "$bin" && -f $run_bin.commit ]] && commit_env=("DSF_COMMIT=$(cat "$run_bin.commit")")
    echo "== round $round: $v" >> "$log"
    env "${envs[@]}" "${commit_env[@]}" "$run_bin" bench --backend "${BACKEND:-cuda}" --model "$model" --prompt "${PROMPT:-64}" \
      --decode "${DECODE:-64}" --runs "${RUNS:-3}" --csv "$csv" --label "${LABEL:-perf-pooled} ${v//,/ }" \
      >> "$log" 2>&1 || { echo "gpu-ab: the run of $v failed (see $log)" >&2; exit 1; }
  done
done
# Each variant's medians in the order the rounds ran them: decode tok/s and (CUDA) graph step ms.
awk '/^== round/ { v = $4 } /^decode_tokens_per_s / { tok[v] = tok[v] " " $2 }
     /^decode_step_ms_median / { step[v] = step[v] " " $2 }
     END { for (v in tok) printf "%-40s tok/s:%s%s\n", v, tok[v], step[v] == "" ? "" : ";  graph step ms:" step[v] }' \
  "$log" | sort
