#!/usr/bin/env bash
# The main job: builds, then runs one Kimi-K3 MoE layer's routed experts (a synthetic full-size
# layer generated on the fly, EP32 rank 0) on the GPU when there is one, on the CPU reference
# otherwise, and prints the error against the float64 reference. Extra arguments go to `k3moe run`;
# --help prints this usage, then builds (when needed) and lists `k3moe run`'s options.
#
#   scripts/run.sh [--checkpoint DIR] [--tokens N] [--mode a16|mxfp8] [--ep-size N --ep-rank R] ...
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ "${1:-}" =~ ^(-h|--help)$ ]]; then (source "$root/scripts/usage.sh"); echo; fi
echo "run.sh: building (log: build.log)" >&2
"$root/scripts/build.sh" > "$root/build.log" 2>&1 || { tail -n 40 "$root/build.log"; exit 1; }
exec "$root/build/tools/k3moe" run "$@"
