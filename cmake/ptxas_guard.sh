#!/usr/bin/env bash
# Compiler launcher for the library's CUDA sources: runs the compile command and fails it when
# ptxas reports that it serialized wgmma instructions (a warpgroup MMA pipeline silently turned
# into one-at-a-time execution, e.g. when the accumulators are touched before wgmma_wait). ptxas
# prints that as an "info" line, which -Werror does not catch. Used by src/CMakeLists.txt; its
# own test: tests/build/serialized_wgmma.cu.
out=$("$@" 2>&1)
rc=$?
[ -n "$out" ] && printf '%s\n' "$out" >&2
if [ $rc -eq 0 ] && grep -q "wgmma.mma_async instructions are serialized" <<<"$out"; then
  echo "error: ptxas serialized wgmma instructions (see above); the kernel would lose its MMA pipelining" >&2
  exit 1
fi
exit $rc
