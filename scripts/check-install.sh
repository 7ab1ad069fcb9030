#!/usr/bin/env bash
# Installs build/ into a temporary prefix and builds a consumer project with find_package(k3moe).
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$root/build" --prefix "$prefix/install" > /dev/null
cmake -S "$root/tests/install_consumer" -B "$prefix/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix/install" > /dev/null
cmake --build "$prefix/consumer" > /dev/null
"$prefix/consumer/consumer"
