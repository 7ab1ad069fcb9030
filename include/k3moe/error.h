// The library's one error type. Every check names what it checked, the expected and the actual
// value, and carries the file:line that raised it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace k3moe {

class Error : public std::runtime_error {
 public:
  Error(std::string message, const char* file, int line)
      : std::runtime_error(message + " [" + file + ":" + std::to_string(line) + "]"),
        message_(std::move(message)) {}

  // The message without the source location, for callers that format errors themselves.
  const std::string& message() const noexcept { return message_; }

 private:
  std::string message_;
};

namespace detail {
template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}
}  // namespace detail

}  // namespace k3moe

// K3MOE_FAIL("w13_scale must be ", expected, ", got ", actual): throws k3moe::Error.
#define K3MOE_FAIL(...) throw ::k3moe::Error(::k3moe::detail::concat(__VA_ARGS__), __FILE__, __LINE__)

// K3MOE_CHECK(cond, message parts...): throws k3moe::Error with the message when cond is false.
#define K3MOE_CHECK(cond, ...)      \
  do {                              \
    if (!(cond)) K3MOE_FAIL(__VA_ARGS__); \
  } while (0)
