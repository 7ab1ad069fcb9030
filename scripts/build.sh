#!/usr/bin/env bash
# Configures and builds k3moe into build/ (Release). With nvcc: the GPU library, kernels and
# tools; without: the host library, the CPU tests and `k3moe run` on the CPU reference.
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/bootstrap.sh"
cuda=ON
command -v nvcc >/dev/null || { cuda=OFF; echo "build: no nvcc found, building without CUDA (CPU only)"; }
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DK3MOE_CUDA=$cuda \
  -DPython3_EXECUTABLE="$root/.venv/bin/python" > "$root/build-configure.log" || { cat "$root/build-configure.log"; exit 1; }
cmake --build "$root/build" -j "$(nproc)"
