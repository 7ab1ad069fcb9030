#!/usr/bin/env bash
# Builds `k3moe` (the CLI, Release) of any commit into OUTDIR, for scripts/ab.sh's same-run A/B of
# two commits on a lent GPU: the commit is checked out into a throwaway git worktree, so this
# checkout and its build/ stay as they are. OUTDIR/BUILT_FROM names the commit, and ab.sh passes
# it to `bench --commit`. Without nvcc the CLI is the CPU-only one (it cannot bench).
#
#   scripts/prebuild-commit.sh COMMIT OUTDIR
#
# e.g. scripts/prebuild-commit.sh 0e8bf42 .gpu-bin/s64 && scripts/prebuild-commit.sh HEAD .gpu-bin/main
# then on the GPU machine (carry both): scripts/ab.sh .gpu-bin/s64/k3moe .gpu-bin/main/k3moe 3 ...
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage="usage: scripts/prebuild-commit.sh COMMIT OUTDIR"
commit=${1:?$usage}
out=${2:?$usage}
[ $# -eq 2 ] || { echo "$usage" >&2; exit 2; }
sha=$(git -C "$root" rev-parse --verify --quiet "$commit^{commit}") ||
  { echo "prebuild-commit: '$commit' names no commit of $root" >&2; exit 2; }
short=$(git -C "$root" rev-parse --short=7 "$sha")

source "$root/scripts/bootstrap.sh"
worktree=$(mktemp -d "${TMPDIR:-/tmp}/k3moe-$short.XXXXXX")
cleanup() {
  git -C "$root" worktree remove --force "$worktree" 2> /dev/null || rm -rf "$worktree"
  git -C "$root" worktree prune
}
trap cleanup EXIT
git -C "$root" worktree add --quiet --detach "$worktree" "$sha"
cuda=ON
command -v nvcc > /dev/null || { cuda=OFF; echo "prebuild-commit: no nvcc, building the CPU-only CLI"; }
log="$worktree/prebuild.log"
{ cmake -S "$worktree" -B "$worktree/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DK3MOE_CUDA=$cuda &&
  cmake --build "$worktree/build" --target k3moe_cli -j "$(nproc)"; } > "$log" 2>&1 ||
  { tail -n 40 "$log" >&2; echo "prebuild-commit: the build of $short failed" >&2; exit 1; }
mkdir -p "$out"
cp "$worktree/build/tools/k3moe" "$out/"
echo "$short" > "$out/BUILT_FROM"
echo "prebuild-commit: $(cd "$out" && pwd)/k3moe from $short"
