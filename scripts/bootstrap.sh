#!/usr/bin/env bash
# Installs what building and testing k3moe needs, where it is missing: Debian packages (when run
# as root with apt-get) and a Python virtual environment (.venv) for the cross-check tests.
# Idempotent; prints what it could not install. Sourced or run by scripts/run.sh and test.sh.
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

need_pkgs=()
have_header() { [ -f "/usr/include/$1" ] || [ -f "/usr/local/include/$1" ]; }
command -v cmake >/dev/null || need_pkgs+=(cmake)
command -v ninja >/dev/null || need_pkgs+=(ninja-build)
command -v g++ >/dev/null || need_pkgs+=(g++)
have_header dlpack/dlpack.h || need_pkgs+=(libdlpack-dev)
have_header nlohmann/json.hpp || need_pkgs+=(nlohmann-json3-dev)
have_header CLI/CLI.hpp || need_pkgs+=(libcli11-dev)
have_header gtest/gtest.h || need_pkgs+=(libgtest-dev)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_pkgs+=(python3-venv)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "bootstrap: installing ${need_pkgs[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
  else
    echo "bootstrap: missing ${need_pkgs[*]}; install them (Debian/Ubuntu: apt-get install ${need_pkgs[*]})" >&2
    exit 1
  fi
fi

# The CUDA toolkit is optional for the host library and CPU tests; nvcc is looked up where the
# toolkit installs it.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi

if [ ! -x "$root/.venv/bin/python" ]; then
  echo "bootstrap: creating .venv for the Python cross-checks"
  python3 -m venv "$root/.venv"
fi
if ! "$root/.venv/bin/python" -c 'import numpy, ml_dtypes, safetensors, pytest' 2>/dev/null; then
  "$root/.venv/bin/python" -m pip install -q --disable-pip-version-check -r "$root/requirements-dev.txt"
fi
