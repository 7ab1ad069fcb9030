#!/usr/bin/env bash
# The PyTorch binding: build and install the package with pip (no network, no build isolation,
# against the installed torch) into a temporary target directory, then run its pytest suite there.
# Logs go to OUTDIR; a summary is printed last. On the GPU machine every test runs; on a machine
# without a GPU (CI) the build, the link check and the tests that need no GPU run, with torch
# from scripts/torch-venv.sh.
#
#   scripts/python-check.sh OUTDIR [pytest args...]
#   PYTHON=$(scripts/torch-venv.sh) K3MOE_REQUIRE_GPU=0 scripts/python-check.sh OUTDIR   (no GPU)
#
# Environment: PYTHON (default python3), K3MOE_REQUIRE_GPU (default 1: a test that would skip for
# want of torch, the package, a Hopper GPU, the k3moe program or the safetensors package fails
# instead), BUILD_DIR (default build-py-wheel,
# kept between runs so that a warm machine rebuilds only what changed), K3MOE_BIN (the k3moe
# program for the oracle test; default: built here, host code only, into build-py-host),
# K3MOE_SITE_OUT=DIR (install the package into DIR and keep it there), K3MOE_SITE=DIR (test the
# package installed in DIR by an earlier K3MOE_SITE_OUT run against the same torch, without
# building: saves a GPU machine the build's minutes).
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
set -uo pipefail

out=${1:?usage: scripts/python-check.sh OUTDIR [pytest args...]}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
build_dir=${BUILD_DIR:-$root/build-py-wheel}
if [ -n "${K3MOE_SITE:-}" ]; then
  site=$(cd "$K3MOE_SITE" && pwd) || { echo "K3MOE_SITE=$K3MOE_SITE: no such directory" >&2; exit 2; }
elif [ -n "${K3MOE_SITE_OUT:-}" ]; then
  rm -rf "$K3MOE_SITE_OUT" && mkdir -p "$K3MOE_SITE_OUT" && site=$(cd "$K3MOE_SITE_OUT" && pwd)
else
  site=$(mktemp -d "${TMPDIR:-/tmp}/k3moe-site.XXXXXX")
  trap 'rm -rf "$site"' EXIT
fi
# NOTE: "-dirty" when the tree has uncommitted changes, so a kept site (BUILT_FROM) does not name
# a commit it was not built from.
commit=$(git -C "$root" describe --always --dirty --abbrev=7 2>/dev/null || echo unknown)
export PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
export K3MOE_REQUIRE_GPU=${K3MOE_REQUIRE_GPU:-1}
if ! command -v nvcc > /dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
declare -a summary
record() { summary+=("$(printf '%-22s %-6s %s' "$1" "$2" "$3")"); }
finish() {
  echo
  echo "== python binding summary (commit $commit) =="
  printf '%s\n' "${summary[@]}"
  exit "$1"
}

if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/nvidia-smi.csv" 2>&1
else
  echo "none (no nvidia-smi)" > "$out/nvidia-smi.csv"
fi
"$python" - > "$out/environment.txt" 2>&1 <<'EOF'
import importlib, platform, sys
print("python", sys.version.split()[0], platform.machine())
for name in ("torch", "scikit_build_core", "pytest", "safetensors", "numpy"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "?"))
    except ImportError as e:
        print(name, "MISSING", e)
import torch
print("torch CUDA", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
EOF
echo "GPU: $(head -n 1 "$out/nvidia-smi.csv")"
cat "$out/environment.txt"
cmake --version | head -n 1

# ---- build + install: pip runs scikit-build-core, which runs python/CMakeLists.txt
start=$(date +%s)
if [ -n "${K3MOE_SITE:-}" ]; then
  record "build + install" ok "prebuilt in $site ($(cat "$site/k3moe/BUILT_FROM" 2>/dev/null || echo "commit unknown"))"
elif "$python" -m pip install --no-build-isolation --no-deps --no-index --no-cache-dir --target "$site" \
     --config-settings=build-dir="$build_dir" -v "$root/python" > "$out/pip-install.log" 2>&1; then
  record "build + install" ok "$(( $(date +%s) - start )) s"
  echo "$commit" > "$site/k3moe/BUILT_FROM"
else
  tail -n 40 "$out/pip-install.log"
  record "build + install" FAIL "see pip-install.log"
  finish 1
fi
ls -la "$site/k3moe" > "$out/installed.txt" 2>&1
# One C++ runtime in the process: the module must use torch's libstdc++, not carry its own copy
# (a statically linked libstdc++ crashes in the first formatted message).
lib="$site/k3moe/_k3moe_ops.so"
if [ ! -f "$lib" ]; then
  record "build + install" FAIL "no k3moe/_k3moe_ops.so in the installed package (see installed.txt)"
  finish 1
fi
readelf -d "$lib" >> "$out/installed.txt" 2>&1
if ! readelf -d "$lib" | grep -q 'NEEDED.*libstdc++' || nm -D --defined-only "$lib" | grep -q ' _ZNSt6locale'; then
  record "C++ runtime" FAIL "libstdc++ is linked statically into _k3moe_ops.so (see installed.txt, pip-install.log)"
  finish 1
fi
record "C++ runtime" ok "$(grep -o 'k3moe torch binding: .*' "$out/pip-install.log" 2>/dev/null | head -n 1 | cut -c 22-)"

# ---- the library's float64 reference CLI, for the test of the tests' own reference (without it
# that test skips, or fails under K3MOE_REQUIRE_GPU=1). DLPack's header is the copy the binding's build made from torch.
if [ -z "${K3MOE_BIN:-}" ]; then
  start=$(date +%s)
  if cmake -S "$root" -B "$root/build-py-host" -DK3MOE_CUDA=OFF -DK3MOE_BUILD_TESTS=OFF \
       -DDLPACK_INCLUDE_DIR="$build_dir/dlpack-from-torch" > "$out/reference-cli-build.log" 2>&1 &&
     cmake --build "$root/build-py-host" --target k3moe_cli -j "$(nproc)" >> "$out/reference-cli-build.log" 2>&1; then
    export K3MOE_BIN="$root/build-py-host/tools/k3moe"
    record "reference CLI" ok "$(( $(date +%s) - start )) s"
  else
    record "reference CLI" skip "build failed, see reference-cli-build.log (the oracle test skips, or fails under K3MOE_REQUIRE_GPU=1)"
  fi
fi

# ---- tests: run from a directory outside the tree, so that `import k3moe` is the installed one
start=$(date +%s)
(cd "$site" && PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" "$python" -m pytest -p no:cacheprovider -v -s -rs \
   --junitxml="$out/pytest.xml" "$root/python/tests" "$@") > "$out/pytest.log" 2>&1
rc=$?
counts=$(tail -n 1 "$out/pytest.log" | sed 's/=//g')
record "pytest" "$([ $rc = 0 ] && echo ok || echo FAIL)" "$counts ($(( $(date +%s) - start )) s)"
if [ $rc != 0 ]; then
  grep -E '^(FAILED|ERROR)|Error' "$out/pytest.log" | head -n 30
fi
echo
grep -E '^k3moe overhead|rel-L2 vs emulate' "$out/pytest.log" | sed 's/^/  /' | tail -n 40
grep -E '^k3moe overhead' "$out/pytest.log" > "$out/overhead.txt"
finish $rc
