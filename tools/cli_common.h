// Small pieces the subcommands share.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

#include "k3moe/config.h"
#include "k3moe/progress.h"

namespace k3moe::cli {

// Thrown by a subcommand to end the program with this exit status (e.g. validate's failures).
struct ExitCode {
  int code;
};

// The most tokens `run` and `reference` take (their float64 reference holds [T, H] values).
inline constexpr int kMaxCliTokens = 1 << 20;

// Checks that an option's value is a non-negative decimal integer of at most 2^64 - 1 ("--seed:
// must be a non-negative decimal integer, got '-1'"), before CLI11 converts it: every integer
// option takes it (CLI11 alone reads "010" as octal, "0x10" as hex, and clamps what overflows).
const CLI::Validator& non_negative_integer();

// A ProgressFn that redraws one line on stderr ("stage  done/total  pct  elapsed") at most a few
// times a second, and only once the work has run for more than a second.
ProgressFn stderr_progress();

// "1.23 GB", "512.0 MB" ...
std::string human_bytes(double bytes);

// Fails, naming --tokens, when the host memory that `run` and `reference` need for `tokens` at
// least (the inputs, the router's logits and the two float64 reference outputs, [T, H] each) is
// more than this machine has: checked before a layer loads, not minutes later as a bad_alloc.
void check_host_memory_for_tokens(int tokens, const MoeConfig& config);

// `text` with its control characters (a file's tensor names, metadata, and errors that quote them)
// written as \xNN, so that what a file holds cannot move the cursor, recolour the terminal or
// forge a line of the output.
std::string printable(std::string_view text);

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace k3moe::cli
