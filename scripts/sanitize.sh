#!/usr/bin/env bash
# The CPU tests (without the 16 GB full-size test) under AddressSanitizer and
# UndefinedBehaviorSanitizer, on a host-only Debug build in build-asan/.
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/bootstrap.sh"
cmake -S "$root" -B "$root/build-asan" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DK3MOE_CUDA=OFF -DK3MOE_SANITIZE=ON \
  -DK3MOE_BUILD_TOOLS=OFF > "$root/build-asan-configure.log"
cmake --build "$root/build-asan" -j "$(nproc)" > "$root/build-asan.log" 2>&1 || { tail -n 40 "$root/build-asan.log"; exit 1; }
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir "$root/build-asan" -L cpu --output-on-failure -j "$(nproc)"
