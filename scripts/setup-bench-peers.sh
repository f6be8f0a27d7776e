#!/usr/bin/env bash
# Sets up PyTorch 2.15 from PyPI in a virtualenv of its own (.venv-peers),
# the peer `make bench-peers` measures attn against. Idempotent: does
# nothing when the venv already imports torch 2.15.
#
# libtorch links the CUDA libraries even on CPU, so `pip install --no-deps
# torch` alone does not import: torch is installed with the dependencies it
# declares (its pure-Python ones and NVIDIA's CUDA 13 wheels: about 2.7 GB
# to download, 4.4 GB on disk). triton is not needed on CPU and is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-peers
want=2.15.0
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$want')" 2>/dev/null; then
  exit 0
fi
python=$(command -v python3)
"$python" -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
# everything torch declares but triton, then torch itself without re-resolving
"$venv/bin/pip" install --quiet "torch==$want" numpy 2>&1 | grep -v "^$" || true
"$venv/bin/python" -c "import torch; print('bench-peers: torch', torch.__version__, 'ready in $venv')"
