#!/usr/bin/env bash
# Creates the project virtualenv .venv (gitignored) for the tests that need
# packages from PyPI (safetensors, transformers, tiktoken, llms-from-scratch;
# see requirements-test.txt). Debian's python is externally managed (PEP
# 668), so nothing is installed into it: the venv is made with
# --system-site-packages from /usr/bin/python3, which keeps Debian's
# python3-torch and numpy visible as the oracle.
# requirements-test.txt's "# no-deps: NAME==VERSION" lines are installed by
# a pip line of their own with --no-deps (pip cannot say that per line).
# Idempotent: does nothing when the venv already has every pinned version;
# otherwise (re)creates what is missing. Set ATTN_VENV to put the venv
# elsewhere.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${ATTN_VENV:-$root/.venv}"
req="$root/scripts/requirements-test.txt"

# The pins: "NAME==VERSION" lines, and those after "# no-deps:".
mapfile -t pins < <(sed -n -e '/^[A-Za-z0-9]/p' -e 's/^# no-deps: *//p' "$req" | grep '==')
mapfile -t nodeps < <(sed -n -e 's/^# no-deps: *//p' "$req" | grep '==')

check='import sys, importlib.metadata as m
def have(name, version):
    try:
        return m.version(name) == version
    except m.PackageNotFoundError:
        return False
sys.exit(not all(have(*p.split("==")) for p in sys.argv[1:]))'
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" "${pins[@]}" 2>/dev/null; then
  exit 0
fi
echo "install-python-deps: installing ${pins[*]} into $venv"
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" -r "$req"
if [ ${#nodeps[@]} -gt 0 ]; then
  "${pip[@]}" --no-deps "${nodeps[@]}"
fi
"$venv/bin/python" -c "$check" "${pins[@]}" || {
  echo "install-python-deps: $venv still lacks a pinned version of ${pins[*]}" >&2
  exit 1
}
