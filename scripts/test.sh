#!/usr/bin/env bash
# Builds and runs every test: the CPU tests (formats, checkpoint, reference), the full-size layer
# test (label "large"; skips itself when the disk has < 20 GB free), the Python cross-checks, and
# the GPU tests (which skip, saying why, without a Hopper GPU).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/build.sh" > "$root/build.log" 2>&1 || { tail -n 40 "$root/build.log"; exit 1; }
ctest --test-dir "$root/build" --output-on-failure -j "$(nproc)" "$@"
