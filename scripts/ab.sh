#!/usr/bin/env bash
# A same-run A/B of two builds of `k3moe` (bench/NOTES.md's protocol: the binaries alternate in one
# device session, so machine-to-machine spread does not enter the comparison).
#
#   scripts/ab.sh A_BIN B_BIN ROUNDS [bench options...]
#
# e.g. scripts/ab.sh main/k3moe draft/k3moe 2 --suite decode --mode a16
# Prints each round's output (ceilings, rows), labelled A or B; `--no-baseline` is added (the baseline is the same for
# both builds).
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
set -uo pipefail

a=${1:?usage: scripts/ab.sh A_BIN B_BIN ROUNDS [bench options...]}
b=${2:?usage: scripts/ab.sh A_BIN B_BIN ROUNDS [bench options...]}
rounds=${3:?usage: scripts/ab.sh A_BIN B_BIN ROUNDS [bench options...]}
shift 3
for bin in "$a" "$b"; do
  [ -x "$bin" ] || { echo "ab.sh: $bin is not an executable" >&2; exit 2; }
done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "ab.sh: ROUNDS must be a positive integer, got '$rounds'" >&2; exit 2; }

status=0
for ((r = 1; r <= rounds; ++r)); do
  for label in A B; do
    bin=$a
    [ $label = B ] && bin=$b
    echo "-- round $r $label ($bin)"
    # Every line but the input generator's progress (as gpu-check.sh prints it): new shapes too.
    "$bin" bench --no-baseline "$@" | grep -vE '^\s*generate|^\r' || status=1
  done
done
exit $status
