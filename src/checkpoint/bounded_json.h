// JSON parsing for files k3moe does not trust (safetensors headers, config.json, the index).
//
// NOTE: nlohmann::json parses and destroys any nesting depth without recursion, but dump() and
// comparisons recurse: a file nesting arrays a million deep would overflow the stack in an error
// message. The files read here nest a few levels, so deeper input is rejected while parsing.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace k3moe::detail {

// Called for every object key at nesting depth 1 (the top-level object's keys).
using TopKeyFn = std::function<void(const std::string& key)>;

// The parsed value, or a discarded value with `why` set (invalid JSON, or nested deeper than
// max_depth).
inline nlohmann::json parse_bounded_json(std::string_view text, int max_depth, std::string& why,
                                         const TopKeyFn& on_top_key = {}) {
  struct TooDeep {};
  using json = nlohmann::json;
  const json::parser_callback_t callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > max_depth) throw TooDeep{};
    if (on_top_key && event == json::parse_event_t::key && depth == 1 && parsed.is_string())
      on_top_key(parsed.get_ref<const std::string&>());
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    why = e.what();
  } catch (const TooDeep&) {
    why = "nested deeper than " + std::to_string(max_depth) + " levels";
  }
  return json(json::value_t::discarded);
}

}  // namespace k3moe::detail
