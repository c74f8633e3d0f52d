#!/usr/bin/env bash
# On the GPU machine, from a bundle (scripts/gpu-bundle.sh): where one graph decode step's time
# goes. Runs `dsflash bench --profile-step` under ncu (gpu__time_duration of every kernel of the
# step, each alone on the GPU, clocks left alone) and prints scripts/ncu_step_table.py's table;
# with CSV set, appends its rows there (bench/results.csv format).
#   scripts/gpu-step-profile.sh MODEL [PROMPT] [CSV]     (logs under ${OUT:-out/gpu-logs})
# Environment variables of the run (DSF_* toggles) apply to the profiled step.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: scripts/gpu-step-profile.sh MODEL [PROMPT] [CSV]}
prompt=${2:-64}
csv=${3:-}
logs=${OUT:-out/gpu-logs}
mkdir -p "$logs"
export LD_LIBRARY_PATH=$PWD/out/gpu/lib
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1 || true)
[[ -x $ncu ]] || { echo "gpu-step-profile: no ncu found" >&2; exit 1; }
"$ncu" --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \
  --log-file "$logs/step-ncu.csv" \
  out/gpu/bin/dsflash bench --backend cuda --model "$model" --prompt "$prompt" --decode 4 --profile-step \
  > "$logs/step-profile.log" 2>&1 || { tail -5 "$logs/step-profile.log" >&2; exit 1; }
commit=$(cat out/gpu/commit 2>/dev/null || git rev-parse --short HEAD)
machine="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) test machine ($(nproc) threads, $(uname -m))"
python3 scripts/ncu_step_table.py "$logs/step-ncu.csv" --commit "$commit" --machine "${DSF_MACHINE:-$machine}" \
  --label "$(basename "$model") prompt=$prompt, one graph decode step" ${csv:+--csv "$csv"}
