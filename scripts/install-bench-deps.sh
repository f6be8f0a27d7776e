#!/usr/bin/env bash
# Installs what attn-bench (make bench) compares with: OpenBLAS (Debian's
# libopenblas0-pthread), the machine's practical SGEMM peak. The bench loads
# it at run time; neither the library nor the bench links it.
# Idempotent: does nothing when it is already there.
set -euo pipefail

package=libopenblas0-pthread
if dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
  exit 0
fi

echo "install-bench-deps: installing $package"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-bench-deps: need root or sudo for apt-get" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "$package"
