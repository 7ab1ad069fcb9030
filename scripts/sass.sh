#!/usr/bin/env bash
# The SASS of k3moe's kernels, read on any machine (no GPU): cuobjdump from the CUDA toolkit when it
# has one, else from PyPI's nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels, unpacked once
# into .deps/cuobjdump.
#
#   scripts/sass.sh FILE [FUNCTION_REGEX]
#   scripts/sass.sh --compare BUILD_A BUILD_B
#
# FILE: an object (build*/src/CMakeFiles/k3moe.dir/kernels/*.cu.o), the library or a binary.
# Without a regex: one line per kernel, its instruction count and its demangled name. With one: the
# SASS of the kernels whose mangled name matches it (e.g. 'permute_block_kernel').
# --compare: for each CUDA object of the library in two build trees (e.g. two commits' checkouts),
# "same" or "DIFF" of their SASS, the source paths and the path-derived anonymous-namespace names
# set aside, kernels compared in name order: a host-only change leaves every line "same", with no
# GPU needed to show it. Exits 1 on a difference.
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: scripts/sass.sh FILE [FUNCTION_REGEX] | --compare BUILD_A BUILD_B"
file=${1:?$usage}
pattern=${2:-}

tool=$(command -v cuobjdump || true)
[ -z "$tool" ] && [ -x /usr/local/cuda/bin/cuobjdump ] && tool=/usr/local/cuda/bin/cuobjdump
if [ -z "$tool" ]; then  # cuobjdump -sass runs nvdisasm: both from PyPI, side by side
  deps="$root/.deps/cuobjdump"
  if [ ! -x "$deps/bin/cuobjdump" ] || [ ! -x "$deps/bin/nvdisasm" ]; then
    echo "sass.sh: no cuobjdump here; fetching PyPI's nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm into $deps" >&2
    mkdir -p "$deps/bin"
    for package in cuobjdump nvdisasm; do
      python3 -m pip download -q --no-deps --disable-pip-version-check "nvidia-cuda-$package>=13,<14" -d "$deps"
      python3 -m zipfile -e "$(ls "$deps"/nvidia_cuda_"$package"-*.whl | head -n 1)" "$deps/unpacked"
      cp "$(find "$deps/unpacked" -name "$package" -type f | head -n 1)" "$deps/bin/$package"
      chmod +x "$deps/bin/$package"
    done
  fi
  tool="$deps/bin/cuobjdump"
  export PATH="$deps/bin:$PATH"
fi

# Each line behind its kernel's name, kernels sorted (stable: a kernel's lines keep their order), so
# instantiating the same kernels in another order reads as the same code.
normalized_sass() {
  "$tool" -sass "$1" | grep -v 'identifier = ' |
    sed -E 's/_GLOBAL__N__[0-9a-f]+_[0-9]+_[A-Za-z0-9_]+_(cu|cpp)_[0-9a-f]+/_ANON_/g' |
    awk '/Function : /{name = $3} {print name "\t" $0}' | LC_ALL=C sort -s -t$'\t' -k1,1
}

if [ "$file" = --compare ]; then
  a=${2:?$usage} b=${3:?$usage} status=0 n=0
  for object in "$a"/src/CMakeFiles/k3moe.dir/*/*.cu.o; do
    name=${object#"$a"/}
    if [ ! -f "$b/$name" ]; then
      echo "DIFF  $name (not in $b)"; status=1
    elif cmp -s <(normalized_sass "$object") <(normalized_sass "$b/$name"); then
      echo "same  $name"
    else
      echo "DIFF  $name"; status=1
    fi
    n=$((n + 1))
  done
  [ "$n" -gt 0 ] || { echo "sass.sh: no CUDA objects under $a/src/CMakeFiles/k3moe.dir" >&2; exit 2; }
  exit $status
elif [ -z "$pattern" ]; then
  "$tool" -sass "$file" |
    awk '/Function : /{if (name != "") print n, name; name = $3; n = 0} /^ +\/\*[0-9a-f]+\*\/ /{n++}
         END{if (name != "") print n, name}' |
    c++filt | sort -k2
else
  "$tool" -sass "$file" | awk -v re="$pattern" '/Function : /{keep = ($3 ~ re)} keep'
fi
