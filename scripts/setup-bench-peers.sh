#!/usr/bin/env bash
# Sets up PyTorch 2.15 from PyPI in a virtualenv of its own (.venv-peers),
# the peer `make bench-peers` measures attn against. Idempotent: does
# nothing when the venv already imports torch 2.15.
#
# libtorch links the CUDA libraries even on CPU, so `pip install --no-deps
# torch` alone does not import: torch is installed with the dependencies it
# declares (its pure-Python ones and NVIDIA's CUDA 13 wheels: about 2.7 GB
# to download, 4.4 GB on disk). triton is not needed on CPU and is skipped.
# The book's own models (llms-from-scratch 1.0.19, pure Python, installed
# without its dependencies) are the peer of attn generate's tokens/s, and
# with tiktoken (its "gpt2" encoding built offline from data/gpt2-bpe) of
# attn pretrain's run (bench/pretrain_peer.py).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-peers
want=2.15.0
book=1.0.19
tiktoken=0.9.0
have_torch() {
  [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$want')" 2>/dev/null
}
have_book() {
  "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('llms-from-scratch') != '$book' or m.version('tiktoken') != '$tiktoken')" 2>/dev/null
}
if have_torch && have_book; then
  exit 0
fi
if ! have_torch; then
  python=$(command -v python3)
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  # everything torch declares but triton, then torch itself without re-resolving
  "$venv/bin/pip" install --quiet "torch==$want" numpy 2>&1 | grep -v "^$" || true
fi
have_book || "$venv/bin/pip" install --quiet --no-deps "llms-from-scratch==$book" "tiktoken==$tiktoken" regex requests
"$venv/bin/python" -c "import torch; print('bench-peers: torch', torch.__version__, 'ready in $venv')"
