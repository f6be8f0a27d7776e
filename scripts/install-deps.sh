#!/usr/bin/env bash
# Installs what building and testing attn needs, from Debian's packages:
# a C toolchain, CMake, and python3-torch + numpy for the PyTorch conformance
# tests. Idempotent: does nothing when everything is already there.
set -euo pipefail

# clang with libclang-rt-14-dev: libFuzzer and the sanitizer runtimes
# (scripts/fuzz.sh); valgrind and pkg-config for CI's memcheck pass and the
# install test.
packages=(build-essential cmake clang libclang-rt-14-dev python3 python3-torch python3-numpy
          valgrind pkg-config)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo for apt-get" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
