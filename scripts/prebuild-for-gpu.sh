#!/usr/bin/env bash
# Builds, on a machine without a GPU, what a GPU session runs, so that the lent machine's minutes
# go to running: `k3moe` and `k3moe_gpu_tests` (Release build in build/, as scripts/build.sh) into
# OUTDIR, and the PyTorch binding installed into OUTDIR/site (scripts/python-check.sh with
# K3MOE_SITE_OUT, against scripts/torch-venv.sh's torch; its no-GPU tests run too). OUTDIR/BUILT_FROM
# names the commit (with -dirty for uncommitted changes). Then, on the GPU machine (carry OUTDIR;
# the device tool carries at most 64 MiB, this is ~35 MB):
#   scripts/gpu-check.sh $OUT/gc --bin OUTDIR --site OUTDIR/site --pack   (commit: OUTDIR/BUILT_FROM)
#
#   scripts/prebuild-for-gpu.sh [OUTDIR]      (default: .gpu-bin/<commit>, ignored by git)
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
commit=$(git -C "$root" describe --always --dirty --abbrev=7)
out=${1:-$root/.gpu-bin/$commit}
if ! command -v nvcc > /dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
command -v nvcc > /dev/null || { echo "prebuild-for-gpu: no nvcc: the GPU binaries need the CUDA toolkit" >&2; exit 1; }

"$root/scripts/build.sh"
mkdir -p "$out"
out=$(cd "$out" && pwd)
cp "$root/build/tools/k3moe" "$root/build/tests/k3moe_gpu_tests" "$out/"
python=$("$root/scripts/torch-venv.sh")
PYTHON=$python K3MOE_REQUIRE_GPU=0 K3MOE_SITE_OUT="$out/site" "$root/scripts/python-check.sh" "$out/python-check"
rm -rf "$out/python-check"  # its logs: not needed on the GPU machine
echo "$commit" > "$out/BUILT_FROM"
echo "prebuild-for-gpu: $out ($(du -sh "$out" | cut -f1), commit $commit)"
