#!/usr/bin/env bash
# The main job (README): installs dependencies, builds, writes the tiny demo model, inspects
# it and tokenizes a sentence. Later milestones extend it to both services, a streamed
# Generate and a metrics scrape.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
scripts/build.sh
build=${DSF_BUILD_DIR:-build}
model=${DSF_DEMO_MODEL:-$build/demo/tiny.gguf}
mkdir -p "$(dirname "$model")"
echo "== writing the tiny synthetic DeepSeek-V4.1 model"
"$build/tools/dsflash" mkmodel --preset tiny --seed 1 --out "$model"
echo "== inspecting it"
"$build/tools/dsflash" inspect "$model"
sentence="The expert store streams 12345 experts to the GPU, 今天 🙂"
echo "== tokenizing: $sentence"
"$build/tools/dsflash" tokenize --model "$model" "$sentence"
echo "== the same sentence as a V4.1 chat prompt (thinking mode)"
"$build/tools/dsflash" tokenize --model "$model" --chat --thinking --effort high "$sentence"
