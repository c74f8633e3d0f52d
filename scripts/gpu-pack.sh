#!/usr/bin/env bash
# Packs what one H200 session needs into out/gpu-all.tar.xz (under the device runner's 64 MiB
# carry): the bundle of scripts/gpu-bundle.sh (rebuilt unless --no-build) without the expert
# store's and sampler's benchmarks, and optionally an earlier build of dsflash as
# out/gpu/bin/dsflash-prev (with its commit in dsflash-prev.commit) for scripts/gpu-ab.sh's
# DSF_BIN=out/gpu/bin/dsflash-prev variant.
#   scripts/gpu-pack.sh [--no-build] [PREV_DSFLASH COMMIT]
# Then, carrying out/gpu-all.tar.xz: scripts/gpu-session.sh on the H200.
set -euo pipefail
cd "$(dirname "$0")/.."
build=1
if [[ ${1:-} == --no-build ]]; then build=0; shift; fi
prev=${1:-}
prev_commit=${2:-}
[[ -z $prev || -n $prev_commit ]] || { echo "gpu-pack: PREV_DSFLASH needs its COMMIT" >&2; exit 2; }
[[ -z $prev || -x $prev ]] || { echo "gpu-pack: no executable $prev" >&2; exit 1; }
if ((build)); then scripts/gpu-bundle.sh; fi
[[ -d out/gpu/bin ]] || { echo "gpu-pack: no out/gpu (run scripts/gpu-bundle.sh)" >&2; exit 1; }
rm -f out/gpu/bin/dsflash-prev out/gpu/bin/dsflash-prev.commit
if [[ -n $prev ]]; then
  cp "$prev" out/gpu/bin/dsflash-prev
  strip --strip-unneeded out/gpu/bin/dsflash-prev 2>/dev/null || true
  echo "$prev_commit" > out/gpu/bin/dsflash-prev.commit
fi
# The dictionary spans the two dsflash builds, which then cost little more than one.
tar -C out -c --exclude=gpu/bin/expert_stream_bench --exclude=gpu/bin/sampler_bench \
  --exclude=gpu/bin/expertstore_bench --exclude=gpu/bin/expert_cache_sim gpu |
  xz -T2 --lzma2=preset=6,dict=192MiB > out/gpu-all.tar.xz
size=$(stat -c %s out/gpu-all.tar.xz)
echo "gpu-pack: out/gpu-all.tar.xz $((size >> 20)) MiB (commit $(cat out/gpu/commit)${prev:+, prev $prev_commit})"
((size < 60 << 20)) || { echo "gpu-pack: over 60 MiB, too close to the carry limit" >&2; exit 1; }
