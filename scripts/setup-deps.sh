#!/usr/bin/env bash
# Installs everything dsflash needs to build and test on a fresh Debian 12 machine, from
# Debian's packages. Idempotent; uses sudo when not run as root. CUDA is optional: when
# /usr/local/cuda/bin/nvcc exists the build also compiles the CUDA backend.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev nlohmann-json3-dev libicu-dev
  libgtest-dev libgmock-dev python3 prometheus curl
  nodejs yamllint clang libclang-rt-14-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Debian's nodejs needs its npm package; a nodejs that bundles npm conflicts with it.
command -v npm > /dev/null || missing+=(npm)
if ((${#missing[@]})); then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  echo "setup-deps: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "setup-deps: all build dependencies present"
