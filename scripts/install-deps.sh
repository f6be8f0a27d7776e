#!/usr/bin/env bash
# Installs what building and testing attn needs, from Debian's packages:
# a C toolchain, CMake, python3-torch + numpy for the PyTorch conformance
# tests, libpng-dev for `attn heatmap`, python3-venv for the project
# virtualenv; then (install-python-deps.sh) the PyPI packages some tests
# use, into .venv. Idempotent: does nothing when everything is already there.
# With --build-only (make demo), only what building the attn command needs.
set -euo pipefail

# clang with libclang-rt-14-dev: libFuzzer and the sanitizer runtimes
# (scripts/fuzz.sh); valgrind for CI's memcheck pass; pkg-config for the
# install test and libpng; Open MPI for the context-parallel layer and its
# tests (mpirun -np 2..4 on this machine); locales for its sources, from
# which test_locale compiles a comma-decimal locale.
packages=(build-essential cmake clang libclang-rt-14-dev python3 python3-torch python3-numpy
          libpng-dev pkg-config python3-venv valgrind libopenmpi-dev openmpi-bin locales)

build_only=false
if [ "${1:-}" = "--build-only" ]; then
  build_only=true
  packages=(build-essential cmake libpng-dev pkg-config)
elif [ $# -gt 0 ]; then
  echo "install-deps: unknown argument '$1' (only --build-only)" >&2
  exit 2
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  $build_only && exit 0
  exec "$(dirname "$0")/install-python-deps.sh"
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
$build_only && exit 0
exec "$(dirname "$0")/install-python-deps.sh"
