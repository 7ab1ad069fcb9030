#!/usr/bin/env bash
# Runs a command while nvidia-smi samples the GPU's SM clock, power and temperature every 50 ms,
# then prints one line per second: clock range, peak power, temperature. What bench --sustain-ms
# (bench/NOTES.md, Session 28) is about: under sustained load the H200 reaches its power limit and
# lowers its SM clock.
#
#   scripts/power-trace.sh OUT.csv COMMAND [ARGS...]
#
# e.g. scripts/power-trace.sh /tmp/p.csv build/tools/k3moe bench --shape ep16 --tokens 256 --sustain-ms 2000
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
set -uo pipefail

csv=${1:?usage: scripts/power-trace.sh OUT.csv COMMAND [ARGS...]}
shift
[ $# -gt 0 ] || { echo "power-trace.sh: no command given" >&2; exit 2; }
command -v nvidia-smi >/dev/null || { echo "power-trace.sh: nvidia-smi not found" >&2; exit 2; }

nvidia-smi --query-gpu=power.limit,enforced.power.limit,clocks.max.sm --format=csv,noheader
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 50 > "$csv" &
sampler=$!
"$@"
status=$?
kill $sampler 2>/dev/null
wait $sampler 2>/dev/null
# "2026/12/01 06:33:38.123, 1395 MHz, 700.38 W, 59": per second, SM clock min-max, peak W, last temperature
awk -F', ' '{ split($1, d, " "); t = substr(d[2], 1, 8); c = $2 + 0; p = $3 + 0;
              if (!(t in lo) || c < lo[t]) lo[t] = c; if (c > hi[t]) hi[t] = c; if (p > w[t]) w[t] = p; temp[t] = $4 + 0 }
            END { for (t in lo) printf "%s  SM %4d-%4d MHz  peak %6.1f W  %d C\n", t, lo[t], hi[t], w[t], temp[t] }' "$csv" | sort
exit $status
