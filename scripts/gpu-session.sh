#!/usr/bin/env bash
# On the H200, carrying out/gpu-all.tar.xz (scripts/gpu-pack.sh): unpacks it, then runs
# interleaved A/B rounds of the decode benchmark (AB_VARIANTS, scripts/gpu-ab.sh; ROUNDS, PROMPT
# and the rest as there), the GPU tests (RUN_TESTS=1, the default; no benchmarks) and NCU_CMD
# (a command line, e.g. scripts/gpu-step-profile.sh). Everything is logged under $OUT (the
# device runner's folder; out/gpu-logs elsewhere): ab.txt and bench.csv first.
#   AB_VARIANTS="base DSF_BIN=out/gpu/bin/dsflash-prev" ROUNDS=2 scripts/gpu-session.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
t0=$SECONDS
tar -C out -xJf out/gpu-all.tar.xz || { echo "gpu-session: cannot unpack out/gpu-all.tar.xz" >&2; exit 1; }
echo "unpacked in $((SECONDS - t0)) s (commit $(cat out/gpu/commit))"
export OUT=${OUT:-out/gpu-logs}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > "$OUT/gpu.txt" 2>&1
rc=0
if [[ -n ${AB_VARIANTS:-} ]]; then
  # shellcheck disable=SC2086  # the variants are words
  scripts/gpu-ab.sh "$OUT/bench.csv" $AB_VARIANTS > "$OUT/ab.txt" 2>&1 || rc=1
  echo "ab rc=$rc"
  tail -30 "$OUT/ab.txt"
fi
if [[ ${RUN_TESTS:-1} == 1 ]]; then
  DSF_SKIP_BENCH=1 scripts/gpu-run.sh > "$OUT/tests.txt" 2>&1 || rc=1
  grep -E "^(PASS|FAIL)" "$OUT/tests.txt"
fi
if [[ -n ${NCU_CMD:-} ]]; then
  eval "$NCU_CMD" > "$OUT/ncu.txt" 2>&1 || rc=1
  tail -60 "$OUT/ncu.txt"
fi
echo "total $((SECONDS - t0)) s, rc=$rc"
exit $rc
