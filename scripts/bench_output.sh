# Sourced by ab.sh and gpu-check.sh: `k3moe bench`'s output without the input generator's progress
# lines ("generate ..." and carriage-return updates), on stdin to stdout. The carriage return is a
# real one: GNU grep reads `\r` in an ERE as the letter r, and so dropped every line starting with r.
drop_input_progress() {
  grep -vE $'^[[:space:]]*generate|^\r'
}
