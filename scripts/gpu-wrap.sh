#!/usr/bin/env bash
# On the H200 through the device runner, which brings back at most a few files of $OUT: runs
# scripts/gpu-session.sh (its switches: AB_VARIANTS, RUN_TESTS, NCU_CMD, ...) with its logs in
# $OUT/logs, then EXTRA (a command line, logged to extra.txt), and packs the logs into
# $OUT/logs.tgz, with bench.csv beside it.
#   AB_VARIANTS="base DSF_ATTN_TC=0" RUN_TESTS=1 scripts/gpu-wrap.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
top=${OUT:?gpu-wrap: OUT, the device runner folder, is not set}
export OUT=$top/logs
mkdir -p "$OUT"
scripts/gpu-session.sh
rc=$?
if [[ -n ${EXTRA:-} ]]; then
  # Benchmarks in EXTRA write rows with this build's commit and the machine's name.
  [[ -f out/gpu/commit ]] && export DSF_COMMIT=${DSF_COMMIT:-$(cat out/gpu/commit)}
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  [[ -n $gpu ]] && export DSF_MACHINE=${DSF_MACHINE:-"$gpu test machine ($(nproc) threads, $(uname -m))"}
  eval "$EXTRA" > "$OUT/extra.txt" 2>&1 || rc=1
  tail -20 "$OUT/extra.txt"
fi
cp "$OUT/bench.csv" "$top/bench.csv" 2>/dev/null
tar -C "$top" -czf "$top/logs.tgz" logs && rm -rf "$OUT"
exit $rc
