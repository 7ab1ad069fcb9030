#!/usr/bin/env bash
# A same-run A/B of two builds of `k3moe` (bench/NOTES.md's protocol: the binaries alternate in one
# device session, so machine-to-machine spread does not enter the comparison).
#
#   scripts/ab.sh A_BIN B_BIN ROUNDS [--json-dir DIR] [bench options...]
#
# e.g. scripts/ab.sh main/k3moe draft/k3moe 2 --json-dir $OUT/ab --shape local28 --tokens 8 16
# Odd rounds run A first, even rounds B first. Prints each round's output (ceilings, rows), labelled
# A or B; `--no-baseline` is added (the baseline is the same for both builds). With --json-dir, each
# run's JSON goes to DIR/A-rN.json or DIR/B-rN.json, and the end prints `scripts/bench_report.py ab`
# over them: per row each build's us per round, B's change, and a verdict. A binary with a
# BUILT_FROM file beside it (scripts/prebuild-for-gpu.sh writes one) runs with --commit from it,
# unless the options name a commit.
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
source "$(dirname "${BASH_SOURCE[0]}")/bench_output.sh"
set -uo pipefail

usage="usage: scripts/ab.sh A_BIN B_BIN ROUNDS [--json-dir DIR] [bench options...]"
a=${1:?$usage}
b=${2:?$usage}
rounds=${3:?$usage}
shift 3
json_dir=""
if [ "${1:-}" = --json-dir ]; then
  json_dir=${2:?ab.sh: --json-dir needs a directory}
  shift 2
  mkdir -p "$json_dir" || exit 2
fi
for bin in "$a" "$b"; do
  [ -x "$bin" ] || { echo "ab.sh: $bin is not an executable" >&2; exit 2; }
done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "ab.sh: ROUNDS must be a positive integer, got '$rounds'" >&2; exit 2; }
if [ -n "$json_dir" ]; then
  for arg in "$@"; do
    [ "$arg" = --json ] && { echo "ab.sh: --json-dir names each run's JSON; drop --json" >&2; exit 2; }
  done
fi
commit_given=0
for arg in "$@"; do [[ $arg == --commit || $arg == --commit=* ]] && commit_given=1; done
# --commit from the BUILT_FROM beside a binary, or nothing.
commit_of() {
  local commit
  ((commit_given == 0)) && commit=$(built_from "$(dirname "$1")") && echo --commit "$commit"
}

status=0
for ((r = 1; r <= rounds; ++r)); do
  order="A B"
  ((r % 2 == 0)) && order="B A"
  for label in $order; do
    bin=$a
    [ $label = B ] && bin=$b
    json=()
    [ -n "$json_dir" ] && json=(--json "$json_dir/$label-r$r.json")
    echo "-- round $r $label ($bin)"
    # Every line but the input generator's progress: new shapes too.
    # shellcheck disable=SC2046  # two words or none
    "$bin" bench --no-baseline "$@" "${json[@]}" $(commit_of "$bin") | drop_input_progress || status=1
  done
done
if [ -n "$json_dir" ]; then
  echo "-- A: $a, B: $b, $rounds rounds"
  python3 "$(dirname "${BASH_SOURCE[0]}")/bench_report.py" ab --a "$json_dir"/A-r*.json --b "$json_dir"/B-r*.json || status=1
fi
exit $status
