# Sourced by ab.sh and gpu-check.sh, which run `k3moe bench` from a build or a prebuilt directory.

# The output without the input generator's progress lines ("generate ..." and carriage-return
# updates), on stdin to stdout. The carriage return is a real one: GNU grep reads `\r` in an ERE as
# the letter r, and so dropped every line starting with r.
drop_input_progress() {
  grep -vE $'^[[:space:]]*generate|^\r'
}

# The commit a prebuilt directory was built from (the BUILT_FROM that scripts/prebuild-for-gpu.sh
# writes); fails without one.
built_from() {
  [ -s "$1/BUILT_FROM" ] && head -n 1 "$1/BUILT_FROM"
}
