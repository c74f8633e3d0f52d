#!/usr/bin/env bash
# On the H200, from a bundle (scripts/gpu-bundle.sh): the first KERNELS kernels (default 130,
# about three layers) of one graph decode step under ncu with their warp-state statistics
# (cycles a warp waits per instruction, ncu's rules naming the main stall), time and
# instructions executed, caches and clocks as they are; then the sm_90 SASS of dsflash (to
# size a kernel's code). Writes $OUT/stalls.csv.gz and $OUT/dsflash.sass.gz.
#   scripts/gpu-ncu-stalls.sh [MODEL] [KERNELS]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
model=${1:-/dev/shm/perf.gguf}
out=${OUT:-out/gpu-logs}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/out/gpu/lib
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
cuobjdump=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
[[ -x $ncu ]] || { echo "gpu-ncu-stalls: no ncu found" >&2; exit 1; }
"$ncu" --profile-from-start off --clock-control none --cache-control none --launch-count "${2:-130}" \
  --section WarpStateStats --metrics gpu__time_duration.sum,sm__cycles_active.avg,smsp__inst_executed.sum \
  --csv --page details --log-file "$out/stalls.csv" \
  out/gpu/bin/dsflash bench --backend cuda --model "$model" --prompt 64 --decode 4 --profile-step > "$out/stalls.log" 2>&1
echo "ncu rc=$?"
gzip -f "$out/stalls.csv"
[[ -x $cuobjdump ]] && "$cuobjdump" -sass -arch sm_90 out/gpu/bin/dsflash 2>&1 | gzip > "$out/dsflash.sass.gz"
ls -la "$out"
