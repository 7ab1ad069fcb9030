#!/usr/bin/env bash
# One command on the GPU machine: build (unless prebuilt binaries are given), run the GPU tests,
# the PyTorch binding's suite (scripts/python-check.sh, into OUTDIR/python), the validation
# matrix, the sanitizers and the benchmark (burst timing, and again under sustained load: `bench
# --sustain-ms`); logs and JSON go to OUTDIR, and a summary table is printed last.
#
#   scripts/gpu-check.sh OUTDIR [--bin DIR] [--site DIR] [--steps tests,python,validate,sanitize,bench,sustained] [--commit SHA] [--pack]
#
# --bin DIR: a directory holding prebuilt `k3moe` and `k3moe_gpu_tests` (skips the build).
# --site DIR: the PyTorch binding installed there by `K3MOE_SITE_OUT=DIR scripts/python-check.sh`
# (the python step then tests it without building it).
# --commit SHA: the commit the JSON records (default: the BUILT_FROM in --bin's directory, else the
# checkout's HEAD).
# --pack: at the end, the logs (and OUTDIR/python) go into OUTDIR/logs.tgz, so that OUTDIR holds
# six files (the device tool brings back a limited number of files per call).
# Without it, the build needs the DLPack header: either installed, or libdlpack-dev*.deb in .deps/
# (unpacked into .deps/prefix, never into /).
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
source "$(dirname "${BASH_SOURCE[0]}")/bench_output.sh"
set -uo pipefail

out=${1:?usage: scripts/gpu-check.sh OUTDIR [--bin DIR] [--site DIR] [--steps LIST] [--commit SHA] [--pack]}
shift
bin="" site="" steps="tests,python,validate,sanitize,bench,sustained" commit="" pack=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --site) site=$(cd "$2" && pwd); shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --commit) commit=$2; shift 2 ;;
    --pack) pack=1; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
if [ -z "$commit" ]; then
  commit=$([ -n "$bin" ] && built_from "$bin") || commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
fi
mkdir -p "$out"
root=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONUNBUFFERED=1
declare -a summary
record() { summary+=("$(printf '%-28s %-6s %s' "$1" "$2" "$3")"); }
want() { [[ ",$steps," == *",$1,"* ]]; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$out/nvidia-smi.csv" 2>&1
echo "GPU: $(tail -n 1 "$out/nvidia-smi.csv")"

if [ -z "$bin" ]; then
  dlpack_args=()
  if [ ! -f /usr/include/dlpack/dlpack.h ] && ls "$root"/.deps/libdlpack-dev*.deb >/dev/null 2>&1; then
    mkdir -p "$root/.deps/prefix"
    for deb in "$root"/.deps/*.deb; do dpkg -x "$deb" "$root/.deps/prefix"; done
    dlpack_args=(-DDLPACK_INCLUDE_DIR="$root/.deps/prefix/usr/include")
  fi
  start=$(date +%s)
  if cmake -S "$root" -B "$root/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release "${dlpack_args[@]}" > "$out/configure.log" 2>&1 &&
     cmake --build "$root/build-gpu" -j "$(nproc)" > "$out/build.log" 2>&1; then
    record build ok "$(( $(date +%s) - start )) s"
  else
    tail -n 30 "$out/configure.log" "$out/build.log"
    record build FAIL "see build.log"
    printf '%s\n' "${summary[@]}"
    exit 1
  fi
  bin="$root/build-gpu/bin-links"
  mkdir -p "$bin"
  ln -sf "$root/build-gpu/tools/k3moe" "$bin/k3moe"
  ln -sf "$root/build-gpu/tests/k3moe_gpu_tests" "$bin/k3moe_gpu_tests"
fi
k3moe="$bin/k3moe"
status=0

if want tests; then
  start=$(date +%s)
  K3MOE_REQUIRE_GPU=1 "$bin/k3moe_gpu_tests" --gtest_output="json:$out/gpu_tests.json" > "$out/gpu_tests.log" 2>&1
  rc=$?
  counts=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/gpu_tests.log" | tr '\n' ' ')
  record "gpu tests" "$([ $rc = 0 ] && echo ok || echo FAIL)" "$counts ($(( $(date +%s) - start )) s)"
  [ $rc = 0 ] || { status=1; grep -E '^\[  FAILED' "$out/gpu_tests.log" | head -20; }
fi

if want python; then
  start=$(date +%s)
  K3MOE_SITE=$site K3MOE_BIN=$(realpath "$k3moe") "$root/scripts/python-check.sh" "$out/python" > "$out/python-check.log" 2>&1
  rc=$?
  record "python binding" "$([ $rc = 0 ] && echo ok || echo FAIL)" "$(grep -E '^pytest ' "$out/python-check.log" | cut -c 30-) ($(( $(date +%s) - start )) s)"
  [ $rc = 0 ] || { status=1; tail -n 30 "$out/python-check.log"; }
fi

if want validate; then
  start=$(date +%s)
  "$k3moe" validate --commit "$commit" --json "$out/validation.json" > "$out/validation.log" 2>&1
  rc=$?
  record "validate (full matrix)" "$([ $rc = 0 ] && echo ok || echo FAIL)" "$(tail -n 2 "$out/validation.log" | head -n 1) ($(( $(date +%s) - start )) s)"
  [ $rc = 0 ] || { status=1; grep -E 'FAIL' "$out/validation.log" | head -20; }
fi

if want sanitize; then
  for tool in memcheck racecheck synccheck; do
    start=$(date +%s)
    # racecheck and synccheck are slow: one mma.sync case (T = 129), the 16-token tiles' 128-row
    # units with two stages per CTA (ep32-896 T = 700) and one wgmma case (T = 257).
    if [ $tool = memcheck ]; then filters=(""); else filters=(" 129 logits" " 700 logits" " 257 logits"); fi
    rc=0
    : > "$out/sanitize-$tool.log"
    for f in "${filters[@]}"; do
      compute-sanitizer --tool $tool --error-exitcode 3 --print-limit 20 "$k3moe" validate --quick ${f:+--filter "$f"} \
        >> "$out/sanitize-$tool.log" 2>&1 || rc=$?
    done
    # And ForwardGraph's tests: 14 forwards of a small shape over both GEMM kernels, both modes and
    # token tiles the two cases above do not reach (N = 96: Session 52's racecheck finding).
    K3MOE_REQUIRE_GPU=1 compute-sanitizer --tool $tool --error-exitcode 3 --print-limit 20 "$bin/k3moe_gpu_tests" --gtest_filter='ForwardGraph.*' \
      >> "$out/sanitize-$tool.log" 2>&1 || rc=$?
    verdict=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize-$tool.log" | tail -n 1)
    record "compute-sanitizer $tool" "$([ $rc = 0 ] && echo ok || echo FAIL)" "$verdict ($(( $(date +%s) - start )) s)"
    [ $rc = 0 ] || { status=1; tail -n 20 "$out/sanitize-$tool.log"; }
  done
fi

if want bench; then
  start=$(date +%s)
  "$k3moe" bench --suite decode --stages --commit "$commit" --json "$out/bench-decode.json" > "$out/bench-decode.log" 2>&1 &&
  "$k3moe" bench --suite prefill --stages --commit "$commit" --json "$out/bench-prefill.json" > "$out/bench-prefill.log" 2>&1
  rc=$?
  record bench "$([ $rc = 0 ] && echo ok || echo FAIL)" "$(( $(date +%s) - start )) s"
  [ $rc = 0 ] || status=1
  echo; cat "$out/bench-decode.log" "$out/bench-prefill.log" | drop_input_progress | tail -n 30
fi

# The same suites in the GPU's steady state: every timed series after 1 s of back-to-back calls.
if want sustained; then
  start=$(date +%s)
  # The SM clock, power and temperature beside it, per second in power-sustained.log.
  "$root/scripts/power-trace.sh" "$out/power-sustained.csv" bash -c '
    "$1" bench --suite decode --sustain-ms 1000 --commit "$2" --json "$3/sustained-decode.json" \
      > "$3/sustained-decode.log" 2>&1 &&
    "$1" bench --suite prefill --sustain-ms 1000 --commit "$2" --json "$3/sustained-prefill.json" \
      > "$3/sustained-prefill.log" 2>&1' _ "$k3moe" "$commit" "$out" > "$out/power-sustained.log" 2>&1
  rc=$?
  record "bench, sustained load" "$([ $rc = 0 ] && echo ok || echo FAIL)" "$(( $(date +%s) - start )) s"
  [ $rc = 0 ] || status=1
  echo; cat "$out/sustained-decode.log" "$out/sustained-prefill.log" | drop_input_progress | tail -n 30
fi

echo
echo "== summary (commit $commit) =="
printf '%s\n' "${summary[@]}" | tee "$out/summary.log"
if [ $pack = 1 ]; then
  (cd "$out" || exit 1
   shopt -s nullglob
   files=(*.log *.csv)
   [ -f gpu_tests.json ] && files+=(gpu_tests.json)
   [ -d python ] && files+=(python)
   tar czf logs.tgz "${files[@]}" && rm -rf "${files[@]}")
fi
exit $status
