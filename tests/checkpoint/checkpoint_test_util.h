// Helpers the checkpoint tests share: temporary directories, raw file bytes, header surgery.
#pragma once

#include <gtest/gtest.h>

#include "expect_error.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3moe/config.h"
#include "k3moe/error.h"

namespace k3moe::testing {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed (with its contents) on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& tag, const fs::path& root = fs::temp_directory_path()) {
    std::string pattern = (root / ("k3moe_" + tag + "_XXXXXX")).string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

inline std::vector<uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

inline std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

inline uint64_t le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

inline void put_le64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}

// A safetensors image from a header text and a data section (no validation: for bad files).
inline std::vector<uint8_t> raw_safetensors(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out(8 + header.size() + data.size());
  put_le64(out.data(), header.size());
  std::copy(header.begin(), header.end(), out.begin() + 8);
  std::copy(data.begin(), data.end(), out.begin() + 8 + long(header.size()));
  return out;
}

struct RawFile {
  std::string header;
  std::vector<uint8_t> data;
};

inline RawFile split_safetensors(const std::vector<uint8_t>& bytes) {
  const uint64_t n = le64(bytes.data());
  return {std::string(bytes.begin() + 8, bytes.begin() + 8 + long(n)),
          std::vector<uint8_t>(bytes.begin() + 8 + long(n), bytes.end())};
}

// Rewrites the header of a safetensors file through `edit`, keeping its data section.
inline void edit_header_text(const fs::path& path, const std::function<void(std::string&)>& edit) {
  RawFile f = split_safetensors(read_bytes(path));
  edit(f.header);
  write_bytes(path, raw_safetensors(f.header, f.data));
}

inline void edit_header(const fs::path& path, const std::function<void(nlohmann::json&)>& edit) {
  edit_header_text(path, [&](std::string& text) {
    nlohmann::json header = nlohmann::json::parse(text);
    edit(header);
    text = header.dump();
  });
}

inline void edit_json_file(const fs::path& path, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(read_text(path));
  edit(j);
  write_text(path, j.dump(2));
}

// Small dimensions that still satisfy the kernels' multiples of 64, with I != H so that a
// transposed shape is a different shape.
inline MoeConfig small_config() {
  MoeConfig c;
  c.hidden = 128;
  c.intermediate = 192;
  c.num_experts = 8;
  c.top_k = 2;
  c.model_hidden = 64;
  return c;
}

}  // namespace k3moe::testing
