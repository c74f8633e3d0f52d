#!/usr/bin/env bash
# Runs every libFuzzer target (built by scripts/sanitize.sh in ${DSF_ASAN_DIR:-build-asan},
# with ASan + UBSan) for ${DSF_FUZZ_SECONDS:-30} seconds each on a scratch copy of its seed
# corpus. Fails on any crash, leak, timeout or sanitizer report; the reproducer is left in
# ${DSF_FUZZ_OUT:-out/fuzz}/<target>/ (add it to tests/fuzz/regressions/<target>/ with the
# fix). Writes a summary line per target (inputs executed, corpus size) to
# ${DSF_FUZZ_OUT:-out/fuzz}/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${DSF_ASAN_DIR:-build-asan}
secs=${DSF_FUZZ_SECONDS:-30}
outdir=${DSF_FUZZ_OUT:-out/fuzz}
declare -A corpus=([gguf]=gguf [gguf_split]=gguf_split [tokenizer]=text [detokenizer]=ids [chat]=chat [request]=request)
rm -rf "$outdir"
mkdir -p "$outdir"
rc=0
for t in gguf gguf_split tokenizer detokenizer chat request; do
  bin=$build/tests/fuzz/fuzz_$t
  [[ -x $bin ]] || { echo "fuzz: $bin missing (run scripts/sanitize.sh)"; exit 1; }
  work=$outdir/$t
  mkdir -p "$work/corpus"
  cp tests/fuzz/corpus/${corpus[$t]}/* "$work/corpus/"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$bin" "$work/corpus" tests/fuzz/regressions/$t -max_total_time="$secs" -max_len=65536 -timeout=20 \
    -rss_limit_mb=4096 -artifact_prefix="$work/" -print_final_stats=1 > "$work/log.txt" 2>&1
  status=$?
  execs=$(grep -m1 'stat::number_of_executed_units' "$work/log.txt" | awk '{print $2}')
  size=$(ls "$work/corpus" | wc -l)
  if [[ $status -eq 0 ]]; then
    echo "fuzz_$t: ok, ${execs:-?} inputs in ${secs} s, corpus $size" | tee -a "$outdir/summary.txt"
  else
    echo "fuzz_$t: FAILED (exit $status), reproducer in $work/" | tee -a "$outdir/summary.txt"
    grep -E 'ERROR|SUMMARY|property violated|Test unit written' "$work/log.txt" | head -5
    rc=1
  fi
done
exit $rc
