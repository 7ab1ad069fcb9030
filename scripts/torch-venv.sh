#!/usr/bin/env bash
# Creates .venv-torch, a virtual environment with torch and the binding's build and test
# packages (python/requirements-check.txt), for scripts/python-check.sh on a machine whose Python
# has no torch (CI; a CPU machine builds the binding and runs the tests that need no GPU). About
# 5 GB from PyPI (torch's CUDA libraries). Idempotent; prints the environment's Python last.
#
#   scripts/torch-venv.sh        then: PYTHON=$(scripts/torch-venv.sh) scripts/python-check.sh OUTDIR
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$root/.venv-torch
requirements=$root/python/requirements-check.txt
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >&2
fi
if ! cmp -s "$requirements" "$venv/installed-requirements.txt"; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements" >&2
  cp "$requirements" "$venv/installed-requirements.txt"
fi
echo "$venv/bin/python"
