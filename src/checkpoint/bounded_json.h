// JSON parsing for files k3moe does not trust (safetensors headers, config.json, the index).
//
// NOTE: nlohmann::json parses and destroys any nesting depth without recursion, but dump() and
// comparisons recurse: a file nesting arrays a million deep would overflow the stack in an error
// message. The files read here nest a few levels, so deeper input is rejected while parsing.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3moe/error.h"

namespace k3moe::detail {

// Whether `text` can be a JSON string (valid UTF-8): checked before work whose output records it.
inline bool is_utf8(const std::string& text) {
  try {
    (void)nlohmann::json(text).dump();
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

// The largest config.json or index read: a full Kimi-K3 index (~330k tensors) is tens of MB, and a
// file of gigabytes is not one, whose whole text would be held in memory.
inline constexpr uintmax_t kMaxJsonFileBytes = uintmax_t(256) << 20;

// The text of a JSON file (config.json, the index). Anything but a regular file is an error, not a
// read that could block (a FIFO) or never end (a device).
inline std::string read_json_file(const std::filesystem::path& path) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  K3MOE_CHECK(!error, path.string(), ": cannot open: ", error.message());
  K3MOE_CHECK(std::filesystem::is_regular_file(status), path.string(), ": not a regular file");
  const uintmax_t size = std::filesystem::file_size(path, error);
  K3MOE_CHECK(!error, path.string(), ": cannot read its size: ", error.message());
  K3MOE_CHECK(size <= kMaxJsonFileBytes, path.string(), ": ", size, " bytes, more than the ", kMaxJsonFileBytes,
              " that a config.json or index may hold");
  std::ifstream in(path, std::ios::binary);
  K3MOE_CHECK(in.good(), path.string(), ": cannot open: ", std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  K3MOE_CHECK(!in.bad(), path.string(), ": read error");
  return text.str();
}

// The parsed value, or a discarded value with `why` set: invalid JSON, nested deeper than
// max_depth, a key twice in one object (readers would disagree on which value holds), a NUL byte
// (the parser would take it for the end of the text and ignore what follows), or a leading UTF-8
// byte order mark (nlohmann::json skips it; Python's json and the safetensors reader reject it).
inline nlohmann::json parse_bounded_json(std::string_view text, int max_depth, std::string& why) {
  struct Rejected {
    std::string why;
  };
  using json = nlohmann::json;
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    why = "a NUL byte at offset " + std::to_string(nul);
    return json(json::value_t::discarded);
  }
  if (text.starts_with("\xEF\xBB\xBF")) {
    why = "it starts with a UTF-8 byte order mark";
    return json(json::value_t::discarded);
  }
  std::vector<std::set<std::string, std::less<>>> keys;  // one set per object being parsed
  const json::parser_callback_t callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > max_depth) throw Rejected{"nested deeper than " + std::to_string(max_depth) + " levels"};
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    if (event == json::parse_event_t::object_end) keys.pop_back();
    if (event == json::parse_event_t::key && !keys.back().insert(parsed.get_ref<const std::string&>()).second)
      throw Rejected{"key '" + parsed.get<std::string>() + "' appears twice in one object"};
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    why = e.what();
  } catch (const Rejected& e) {
    why = e.why;
  }
  return json(json::value_t::discarded);
}

}  // namespace k3moe::detail
