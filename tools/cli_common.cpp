#include "cli_common.h"

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

#include "k3moe/error.h"

namespace k3moe::cli {

const CLI::Validator& non_negative_integer() {
  // NOTE: CLI11 converts integers in base 0 ("010" is 8, "0x10" is 16): only plain decimal passes.
  static const CLI::Validator check(
      [](std::string& text) -> std::string {
        const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        if (!digits) return "must be a non-negative decimal integer, got '" + text + "'";
        if (text.size() > 1 && text[0] == '0') return "must be a decimal integer without leading zeros, got " + text;
        constexpr std::string_view kMax = "18446744073709551615";  // 2^64 - 1
        if (text.size() > kMax.size() || (text.size() == kMax.size() && text > kMax))
          return "must be at most " + std::string(kMax) + ", got " + text;
        return "";
      },
      "INT>=0");
  return check;
}

ProgressFn stderr_progress() {
  struct State {
    Stopwatch since_start;
    double last_draw = -1.0;
    std::string stage;
  };
  auto state = std::make_shared<State>();
  return [state](std::string_view stage, int64_t done, int64_t total) {
    if (state->stage != stage) {
      state->stage = std::string(stage);
      state->since_start = Stopwatch();
      state->last_draw = -1.0;
    }
    const double t = state->since_start.seconds();
    const bool last = done >= total;
    if (t < 1.0 && !(last && state->last_draw >= 0.0)) return;
    if (!last && t - state->last_draw < 0.25) return;
    state->last_draw = t;
    const double pct = total > 0 ? 100.0 * double(done) / double(total) : 100.0;
    std::fprintf(stderr, "\r  %-28s %10lld / %-10lld %5.1f%%  %6.1f s%s", state->stage.c_str(),
                 static_cast<long long>(done), static_cast<long long>(total), pct, t,
                 last ? "\n" : "");
    std::fflush(stderr);
  };
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000.0 && u < 4) {
    bytes /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

void check_host_memory_for_tokens(int tokens, const MoeConfig& config) {
  const double per_token = 2.0 * config.hidden + 4.0 * config.model_hidden + 4.0 * config.num_experts +
                           8.0 * config.top_k + 2 * 8.0 * config.hidden;
  const double needed = per_token * tokens;
  const double machine = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  K3MOE_CHECK(machine <= 0.0 || needed <= machine, "--tokens ", tokens, ": its inputs and the float64 reference's "
              "outputs alone take ", human_bytes(needed), " of host memory, more than this machine's ",
              human_bytes(machine));
}

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte != 0x7f) {
      out += c;
      continue;
    }
    char escaped[5];
    std::snprintf(escaped, sizeof escaped, "\\x%02x", byte);
    out += escaped;
  }
  return out;
}

}  // namespace k3moe::cli
