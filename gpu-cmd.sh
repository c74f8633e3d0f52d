#!/usr/bin/env bash
# untracked helper: run on the device
mode=${1:-all}
rm -rf out/gpu; tar -C out -xJf out/gpu-slim.tar.xz
export LD_LIBRARY_PATH=$PWD/out/gpu/lib DSF_COMMIT=$(cat out/gpu/commit) DSF_MACHINE="NVIDIA H200 test machine (16 threads, x86_64)" DSF_GOLDEN_DIR=$PWD/out/gpu/golden
O=$OUT
B=out/gpu/bin/dsflash
if [[ $mode == all || $mode == tests ]]; then
  mkdir -p /tmp/logs
  (OUT=/tmp/logs DSF_SKIP_BENCH=1 DSF_TESTS=${TESTS:-*} timeout ${TT:-300} bash scripts/gpu-run.sh > $O/tests.log 2>&1)
  grep -E "PASS|FAIL" $O/tests.log
  for f in $(grep FAIL $O/tests.log | awk '{print $2}'); do cp /tmp/logs/$f.log $O/ 2>/dev/null; done
  cp /tmp/logs/model_ops_cuda_test.log /tmp/logs/ops_cuda_test.log $O/ 2>/dev/null
fi
if [[ $mode == all || $mode == bench ]]; then
  t0=$SECONDS; $B mkmodel --preset perf --pooled-experts --out /dev/shm/perf.gguf --no-progress > $O/mkmodel.log 2>&1; echo "mkmodel $((SECONDS-t0)) s"
  for v in ${VARIANTS:-NONE=1}; do
    t0=$SECONDS
    env $v $B bench --backend cuda --model /dev/shm/perf.gguf --prompt 64 --decode 64 --runs 3 --csv $O/bench.csv --label "perf-pooled $v" > $O/bench-$v.log 2>&1
    echo "$v: $((SECONDS-t0)) s $(grep -E 'graph step|tok/s' $O/bench-$v.log | head -3 | tr '\n' ' ')"
  done
fi
if [[ $mode == all || $mode == profile ]]; then
  [[ -f /dev/shm/perf.gguf ]] || $B mkmodel --preset perf --pooled-experts --out /dev/shm/perf.gguf --no-progress > $O/mkmodel.log 2>&1
  OUT=$O timeout ${PT:-240} bash scripts/gpu-step-profile.sh /dev/shm/perf.gguf 64 $O/step.csv > $O/step-table.txt 2>&1; echo "profile rc $?"; head -60 $O/step-table.txt
fi
