// safetensors files: a reader that validates everything before handing out a byte,
// and a streaming writer (tensors are declared up front, then their bytes written in order, so a
// multi-gigabyte shard never has to sit in memory).
//
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets:
// [begin, end]}, "__metadata__": {str: str}}, then the data section; offsets are relative to it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace k3moe {

enum class Dtype { BOOL, U8, I8, U16, I16, U32, I32, U64, I64, F16, BF16, F32, F64, F8_E4M3, F8_E5M2 };

std::string_view to_string(Dtype dtype);  // the safetensors spelling: "U8", "BF16", ...
int64_t dtype_size(Dtype dtype);
// Throws k3moe::Error for an unknown spelling.
Dtype parse_dtype(std::string_view text);

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::U8;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // offsets relative to the data section
  uint64_t end = 0;

  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
  std::string shape_string() const;  // "[3072, 1792]"
};

class SafetensorsFile {
 public:
  // Opens the file and validates the header (no descriptor is kept: each read opens the file again,
  // checks that it is still the one validated, and reads with pread): length within the file, JSON, known dtypes,
  // non-negative shapes, offsets inside the data section, size == numel * dtype size (overflow
  // checked), no two tensors overlapping. Every error names the file (and the tensor).
  static SafetensorsFile open(const std::filesystem::path& path);
  // Same validation over an in-memory image (the fuzzer's entry point). `name` is used in errors.
  static SafetensorsFile from_bytes(std::vector<uint8_t> bytes, const std::string& name);

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::filesystem::path& path() const;
  const std::vector<TensorInfo>& tensors() const;
  const std::map<std::string, std::string>& metadata() const;
  const TensorInfo* find(std::string_view name) const;
  // Throws k3moe::Error "<file>: tensor <name> not found".
  const TensorInfo& get(std::string_view name) const;

  // Copies the tensor's bytes into `out` (out.size() must equal the tensor's size) and counts them
  // in bytes_copied(). Safe to call from several threads at once. A file changed since open()
  // (truncated, rewritten or replaced: another size, mtime or inode) throws k3moe::Error naming the
  // file and the tensor.
  void copy_to(const TensorInfo& tensor, std::span<uint8_t> out) const;
  // The same for bytes [offset, offset + out.size()) of the tensor (a large tensor in pieces).
  void read(const TensorInfo& tensor, uint64_t offset, std::span<uint8_t> out) const;
  uint64_t bytes_copied() const;

  uint64_t file_size() const;

 private:
  struct Impl;
  explicit SafetensorsFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streaming writer: declare every tensor, then call write() once per tensor in declaration
// order. finish() checks that every declared tensor was written.
class SafetensorsWriter {
 public:
  struct Entry {
    std::string name;
    Dtype dtype;
    std::vector<int64_t> shape;
  };
  SafetensorsWriter(const std::filesystem::path& path, std::vector<Entry> entries,
                    std::map<std::string, std::string> metadata = {});
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  ~SafetensorsWriter();

  void write(std::string_view name, std::span<const uint8_t> bytes);
  void finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3moe
