#!/usr/bin/env bash
# Builds and runs the project's ctest suite: the CPU tests (formats, checkpoint, reference), the
# full-size layer test (label "large": it writes ~16 GB under $K3MOE_LARGE_DIR, default the temp
# directory, and skips itself when that filesystem has < 20 GB free), the Python cross-checks
# (NumPy reference, ml_dtypes, safetensors, the CLI's option checks), and the GPU tests (which skip,
# saying why, without a Hopper GPU). The PyTorch binding has its own suite:
# scripts/python-check.sh.
#
#   scripts/test.sh [ctest options...]      e.g. scripts/test.sh -L cpu, scripts/test.sh -R Routing
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
echo "test.sh: building (log: build.log)" >&2
"$root/scripts/build.sh" > "$root/build.log" 2>&1 || { tail -n 40 "$root/build.log"; exit 1; }
ctest --test-dir "$root/build" --output-on-failure -j "$(nproc)" "$@"
