#!/usr/bin/env bash
# Creates the project virtualenv .venv (gitignored) for the tests that need
# packages from PyPI (safetensors, transformers; see requirements-test.txt).
# Debian's python is externally managed (PEP 668), so nothing is installed
# into it: the venv is made with --system-site-packages from /usr/bin/python3,
# which keeps Debian's python3-torch and numpy visible as the oracle.
# Idempotent: does nothing when the venv already has the pinned versions.
# Set ATTN_VENV to put the venv elsewhere.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${ATTN_VENV:-$root/.venv}"
req="$root/scripts/requirements-test.txt"

check='import sys, importlib.metadata as m
want = dict(l.split("==") for l in open(sys.argv[1]).read().split() if "==" in l)
sys.exit(any(m.version(k) != v for k, v in want.items()))'
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" "$req" 2>/dev/null; then
  exit 0
fi
echo "install-python-deps: creating $venv with $(tr '\n' ' ' < <(grep '==' "$req"))"
/usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
