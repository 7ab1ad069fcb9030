#include "k3moe/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "bounded_json.h"
#include "k3moe/error.h"

namespace k3moe {
namespace {

using nlohmann::json;

// The reference implementation's limit; a longer header is a corrupt length field, not a header.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// {name: {"shape": [...]}} nests three levels; anything much deeper is not a header.
constexpr int kMaxHeaderDepth = 8;

struct DtypeInfo {
  Dtype dtype;
  std::string_view name;
  int64_t size;
};

constexpr std::array<DtypeInfo, 15> kDtypes{{
    {Dtype::BOOL, "BOOL", 1}, {Dtype::U8, "U8", 1},       {Dtype::I8, "I8", 1},
    {Dtype::U16, "U16", 2},   {Dtype::I16, "I16", 2},     {Dtype::U32, "U32", 4},
    {Dtype::I32, "I32", 4},   {Dtype::U64, "U64", 8},     {Dtype::I64, "I64", 8},
    {Dtype::F16, "F16", 2},   {Dtype::BF16, "BF16", 2},   {Dtype::F32, "F32", 4},
    {Dtype::F64, "F64", 8},   {Dtype::F8_E4M3, "F8_E4M3", 1}, {Dtype::F8_E5M2, "F8_E5M2", 1},
}};

std::optional<Dtype> find_dtype(std::string_view text) {
  for (const DtypeInfo& d : kDtypes)
    if (d.name == text) return d.dtype;
  return std::nullopt;
}

std::string known_dtypes() {
  std::string list;
  for (const DtypeInfo& d : kDtypes) {
    if (!list.empty()) list += ", ";
    list += d.name;
  }
  return list;
}

std::string short_dump(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

// nlohmann parses "-0" as a signed integer: test the value, not the storage type.
bool negative(const json& integer) { return !integer.is_number_unsigned() && integer.get<int64_t>() < 0; }

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// numel * dtype size, or nullopt when it does not fit in int64.
std::optional<uint64_t> checked_nbytes(const std::vector<int64_t>& shape, int64_t elem_size) {
  uint64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, uint64_t(d), &n)) return std::nullopt;
  if (__builtin_mul_overflow(n, uint64_t(elem_size), &n)) return std::nullopt;
  if (n > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return n;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

std::string_view to_string(Dtype dtype) {
  for (const DtypeInfo& d : kDtypes)
    if (d.dtype == dtype) return d.name;
  return "?";
}

int64_t dtype_size(Dtype dtype) {
  for (const DtypeInfo& d : kDtypes)
    if (d.dtype == dtype) return d.size;
  K3MOE_FAIL("dtype_size: unknown Dtype value ", int(dtype));
}

Dtype parse_dtype(std::string_view text) {
  const auto dtype = find_dtype(text);
  K3MOE_CHECK(dtype.has_value(), "unknown dtype \"", text, "\" (known: ", known_dtypes(), ")");
  return *dtype;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_string() const { return shape_str(shape); }

// ------------------------------------------------------------------------------------- reader

// What identifies the file open() validated: every read checks that the path still names it.
struct FileIdentity {
  dev_t device = 0;
  ino_t inode = 0;
  uint64_t size = 0;
  timespec modified{};

  static FileIdentity of(const struct stat& st) { return {st.st_dev, st.st_ino, uint64_t(st.st_size), st.st_mtim}; }
  bool operator==(const FileIdentity& o) const {
    return device == o.device && inode == o.inode && size == o.size && modified.tv_sec == o.modified.tv_sec &&
           modified.tv_nsec == o.modified.tv_nsec;
  }
};

// A descriptor closed when it goes out of scope.
struct FileDescriptor {
  int fd = -1;
  explicit FileDescriptor(int f) : fd(f) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

struct SafetensorsFile::Impl {
  std::filesystem::path path;
  std::string label;  // names the file in errors
  bool in_memory = false;      // from_bytes(): `owned` holds the image; open(): read from `path`
  std::vector<uint8_t> owned;
  FileIdentity identity;  // open()'s file, as validated
  uint64_t data_offset = 0;
  uint64_t data_size = 0;
  std::vector<TensorInfo> tensors;  // by offset
  std::map<std::string, size_t, std::less<>> by_name;
  std::map<std::string, std::string> metadata;
  std::atomic<uint64_t> copied{0};

  uint64_t size() const { return in_memory ? owned.size() : identity.size; }
  void parse_header();
  TensorInfo parse_entry(const std::string& name, const json& entry) const;
  void check_range(const TensorInfo& t) const {
    K3MOE_CHECK(t.begin <= t.end && t.end <= data_size, label, ": tensor '", t.name, "' offsets [", t.begin,
                ", ", t.end, ") are not inside this file's data section of ", data_size, " bytes");
  }
  // Bytes [offset, offset + out.size()) of the file; `what` names them in errors.
  // NOTE: the file is opened per read, not kept open: a checkpoint of many shards holds no
  // descriptors between reads, and a file truncated, rewritten or replaced since open() is an
  // error here (a mapping would have ended the process with SIGBUS, or mixed two versions).
  void read_at(uint64_t offset, std::span<uint8_t> out, const std::string& what) const {
    if (in_memory) {
      std::memcpy(out.data(), owned.data() + offset, out.size());
      return;
    }
    const FileDescriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
    K3MOE_CHECK(file.fd >= 0, label, ": cannot open it again to read ", what, ": ", std::strerror(errno));
    struct stat st {};
    K3MOE_CHECK(fstat(file.fd, &st) == 0, label, ": cannot stat it to read ", what, ": ", std::strerror(errno));
    const FileIdentity now = FileIdentity::of(st);
    K3MOE_CHECK(now == identity, label, ": changed since it was opened (", identity.size, " bytes then, ", now.size,
                " now", now.inode != identity.inode ? ", another file" : "", "): was it truncated, rewritten or "
                "replaced? Open it again to read ", what);
    // NOTE: no readahead: a rank reads its experts' ranges of a shard, not the rest (the
    // large-layer test counts the bytes the OS read).
    posix_fadvise(file.fd, 0, 0, POSIX_FADV_RANDOM);
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = ::pread(file.fd, out.data() + done, out.size() - done, off_t(offset + done));
      if (n < 0 && errno == EINTR) continue;
      K3MOE_CHECK(n >= 0, label, ": reading ", what, " failed at byte ", offset + done, ": ", std::strerror(errno));
      K3MOE_CHECK(n > 0, label, ": the file ends before byte ", offset + out.size(), " of ", what, " (bytes [",
                  offset, ", ", offset + out.size(), ")); it was ", identity.size,
                  " bytes when opened: was it truncated or rewritten since?");
      done += size_t(n);
    }
  }
};

void SafetensorsFile::Impl::parse_header() {
  const uint64_t size = this->size();
  K3MOE_CHECK(size >= 8, label, ": file is ", size, " bytes, too short for the 8-byte header length");
  uint8_t length[8];
  read_at(0, length, "the header length");
  const uint64_t n = read_le64(length);
  K3MOE_CHECK(n > 0, label, ": header length is 0 (a safetensors header is at least \"{}\")");
  K3MOE_CHECK(n <= kMaxHeaderBytes, label, ": header length ", n, " exceeds the limit of ", kMaxHeaderBytes,
              " bytes (corrupt length field?)");
  K3MOE_CHECK(n <= size - 8, label, ": header length ", n, " runs past the end of the file (", size,
              " bytes, so at most ", size - 8, ")");
  data_offset = 8 + n;
  data_size = size - data_offset;

  std::string text(size_t(n), '\0');
  read_at(8, {reinterpret_cast<uint8_t*>(text.data()), text.size()}, "the header");
  std::string why;
  const json header = detail::parse_bounded_json(text, kMaxHeaderDepth, why);
  K3MOE_CHECK(!header.is_discarded(), label, ": header is not valid JSON: ", why);
  K3MOE_CHECK(header.is_object(), label, ": header must be a JSON object, got ", header.type_name());

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      K3MOE_CHECK(entry.is_object(), label, ": __metadata__ must be an object of strings, got ", entry.type_name());
      for (const auto& [key, value] : entry.items()) {
        K3MOE_CHECK(value.is_string(), label, ": __metadata__ entry '", key, "' must be a string, got ",
                    short_dump(value), " (", value.type_name(), ")");
        metadata.emplace(key, value.get<std::string>());
      }
      continue;
    }
    tensors.push_back(parse_entry(name, entry));
  }

  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end != b.end ? a.end < b.end : a.name < b.name;
  });
  // The format's rule: the tensors tile the data section, in offset order, with no overlap, no hole
  // and nothing after them (so that no bytes hide in a file unread); an empty tensor sits at a
  // boundary between two others.
  const TensorInfo* previous = nullptr;
  uint64_t covered = 0;
  for (const TensorInfo& t : tensors) {
    if (t.begin < covered)
      K3MOE_FAIL(label, ": tensors '", previous->name, "' [", previous->begin, ", ", previous->end, ") and '", t.name,
                 "' [", t.begin, ", ", t.end, ") overlap");
    K3MOE_CHECK(t.begin == covered, label, ": bytes [", covered, ", ", t.begin, ") of the data section before tensor '",
                t.name, "' belong to no tensor (safetensors allows no holes)");
    covered = t.end;
    previous = &t;
  }
  K3MOE_CHECK(covered == data_size, label, ": the tensors cover ", covered, " bytes of the ", data_size,
              "-byte data section; the last ", data_size - covered, " belong to no tensor (safetensors allows none)");
  for (size_t i = 0; i < tensors.size(); ++i) by_name.emplace(tensors[i].name, i);
}

TensorInfo SafetensorsFile::Impl::parse_entry(const std::string& name, const json& entry) const {
  const std::string where = label + ": tensor '" + name + "'";
  K3MOE_CHECK(entry.is_object(), where, ": entry must be an object {dtype, shape, data_offsets}, got ",
              short_dump(entry));
  TensorInfo t;
  t.name = name;

  const auto dtype = entry.find("dtype");
  K3MOE_CHECK(dtype != entry.end(), where, ": 'dtype' missing");
  K3MOE_CHECK(dtype->is_string(), where, ": 'dtype' must be a string, got ", short_dump(*dtype));
  const auto parsed = find_dtype(dtype->get_ref<const std::string&>());
  K3MOE_CHECK(parsed.has_value(), where, ": unknown dtype \"", dtype->get_ref<const std::string&>(),
              "\" (known: ", known_dtypes(), ")");
  t.dtype = *parsed;

  const auto shape = entry.find("shape");
  K3MOE_CHECK(shape != entry.end(), where, ": 'shape' missing");
  K3MOE_CHECK(shape->is_array(), where, ": 'shape' must be an array of integers, got ", short_dump(*shape));
  for (const json& d : *shape) {
    K3MOE_CHECK(d.is_number_integer(), where, ": shape ", short_dump(*shape), " must hold integers, got ",
                short_dump(d));
    K3MOE_CHECK(!negative(d), where, ": shape ", short_dump(*shape), " has a negative dimension");
    K3MOE_CHECK(d.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max()), where, ": shape ",
                short_dump(*shape), " has a dimension too large");
    t.shape.push_back(d.get<int64_t>());
  }

  const auto offsets = entry.find("data_offsets");
  K3MOE_CHECK(offsets != entry.end(), where, ": 'data_offsets' missing");
  K3MOE_CHECK(offsets->is_array() && offsets->size() == 2, where,
              ": 'data_offsets' must be [begin, end], got ", short_dump(*offsets));
  for (const json& o : *offsets)
    K3MOE_CHECK(o.is_number_integer() && !negative(o), where, ": 'data_offsets' ", short_dump(*offsets),
                " must hold non-negative integers");
  t.begin = (*offsets)[0].get<uint64_t>();
  t.end = (*offsets)[1].get<uint64_t>();
  K3MOE_CHECK(t.begin <= t.end, where, ": data_offsets [", t.begin, ", ", t.end, "] has begin > end");
  K3MOE_CHECK(t.end <= data_size, where, ": data_offsets [", t.begin, ", ", t.end,
              "] run past the data section (", data_size, " bytes after the ", data_offset - 8, "-byte header)");

  const auto expected = checked_nbytes(t.shape, dtype_size(t.dtype));
  K3MOE_CHECK(expected.has_value(), where, ": ", t.shape_string(), " ", to_string(t.dtype),
              " overflows a 64-bit byte count");
  K3MOE_CHECK(*expected == t.nbytes(), where, ": ", t.shape_string(), " ", to_string(t.dtype), " needs ",
              *expected, " bytes, but data_offsets [", t.begin, ", ", t.end, "] hold ", t.nbytes());
  return t;
}

SafetensorsFile::SafetensorsFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->label = path.string();
  // O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a writer.
  {
    const FileDescriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
    K3MOE_CHECK(file.fd >= 0, impl->label, ": cannot open: ", std::strerror(errno));
    struct stat st {};
    K3MOE_CHECK(fstat(file.fd, &st) == 0 && S_ISREG(st.st_mode), impl->label, ": not a regular file");
    impl->identity = FileIdentity::of(st);
  }
  impl->parse_header();
  return SafetensorsFile(std::move(impl));
}

SafetensorsFile SafetensorsFile::from_bytes(std::vector<uint8_t> bytes, const std::string& name) {
  auto impl = std::make_unique<Impl>();
  impl->path = name;
  impl->label = name;
  impl->in_memory = true;
  impl->owned = std::move(bytes);
  impl->parse_header();
  return SafetensorsFile(std::move(impl));
}

const std::filesystem::path& SafetensorsFile::path() const { return impl_->path; }
const std::vector<TensorInfo>& SafetensorsFile::tensors() const { return impl_->tensors; }
const std::map<std::string, std::string>& SafetensorsFile::metadata() const { return impl_->metadata; }
uint64_t SafetensorsFile::file_size() const { return impl_->size(); }
uint64_t SafetensorsFile::bytes_copied() const { return impl_->copied.load(); }

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto it = impl_->by_name.find(name);
  return it == impl_->by_name.end() ? nullptr : &impl_->tensors[it->second];
}

const TensorInfo& SafetensorsFile::get(std::string_view name) const {
  const TensorInfo* t = find(name);
  K3MOE_CHECK(t != nullptr, impl_->label, ": tensor ", name, " not found");
  return *t;
}

void SafetensorsFile::read(const TensorInfo& tensor, uint64_t offset, std::span<uint8_t> out) const {
  impl_->check_range(tensor);
  K3MOE_CHECK(offset <= tensor.nbytes() && out.size() <= tensor.nbytes() - offset, impl_->label, ": tensor '",
              tensor.name, "' is ", tensor.nbytes(), " bytes; bytes [", offset, ", ", offset + out.size(),
              ") are not inside it");
  if (out.empty()) return;
  impl_->read_at(impl_->data_offset + tensor.begin + offset, out, "tensor '" + tensor.name + "'");
  impl_->copied += out.size();
}

void SafetensorsFile::copy_to(const TensorInfo& tensor, std::span<uint8_t> out) const {
  impl_->check_range(tensor);
  K3MOE_CHECK(out.size() == tensor.nbytes(), impl_->label, ": tensor '", tensor.name, "' is ", tensor.nbytes(),
              " bytes, but the destination holds ", out.size());
  read(tensor, 0, out);
}

// ------------------------------------------------------------------------------------- writer

struct SafetensorsWriter::Impl {
  std::filesystem::path path;
  std::filesystem::path partial;  // renamed to `path` by finish()
  int fd = -1;
  std::vector<Entry> entries;
  std::vector<uint64_t> sizes;
  size_t next = 0;

  void write_all(const uint8_t* data, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd, data, std::min<size_t>(n, size_t(1) << 30));
      if (w < 0 && errno == EINTR) continue;
      K3MOE_CHECK(w > 0, path.string(), ": write failed: ", std::strerror(errno));
      data += w;
      n -= size_t(w);
    }
  }
  void discard() {
    if (fd >= 0) {
      ::close(fd);
      fd = -1;
      ::unlink(partial.c_str());
    }
  }
};

SafetensorsWriter::SafetensorsWriter(const std::filesystem::path& path, std::vector<Entry> entries,
                                     std::map<std::string, std::string> metadata)
    : impl_(std::make_unique<Impl>()) {
  Impl& w = *impl_;
  w.path = path;
  w.partial = path.string() + ".partial";
  const std::string label = path.string();

  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const Entry& e : entries) {
    K3MOE_CHECK(e.name != "__metadata__", label, ": a tensor cannot be named __metadata__");
    K3MOE_CHECK(!header.contains(e.name), label, ": tensor '", e.name, "' declared twice");
    for (int64_t d : e.shape)
      K3MOE_CHECK(d >= 0, label, ": tensor '", e.name, "' has a negative dimension in ", shape_str(e.shape));
    const auto n = checked_nbytes(e.shape, dtype_size(e.dtype));
    K3MOE_CHECK(n.has_value(), label, ": tensor '", e.name, "' ", shape_str(e.shape), " is too large");
    K3MOE_CHECK(!__builtin_add_overflow(offset, *n, &offset), label, ": data section too large");
    header[e.name] = {{"dtype", std::string(to_string(e.dtype))},
                      {"shape", e.shape},
                      {"data_offsets", {offset - *n, offset}}};
    w.sizes.push_back(*n);
  }
  w.entries = std::move(entries);

  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    K3MOE_FAIL(label, ": cannot encode the header (tensor names and metadata must be UTF-8): ", e.what());
  }
  // NOTE: the spec allows trailing spaces; they put the data section on an 8-byte boundary.
  text.append((8 - text.size() % 8) % 8, ' ');

  w.fd = ::open(w.partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  K3MOE_CHECK(w.fd >= 0, w.partial.string(), ": cannot create: ", std::strerror(errno));
  try {
    uint8_t length[8];
    for (int i = 0; i < 8; ++i) length[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
    w.write_all(length, 8);
    w.write_all(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  } catch (...) {
    w.discard();
    throw;
  }
}

SafetensorsWriter::~SafetensorsWriter() { impl_->discard(); }

void SafetensorsWriter::write(std::string_view name, std::span<const uint8_t> bytes) {
  Impl& w = *impl_;
  K3MOE_CHECK(w.fd >= 0, w.path.string(), ": write('", name, "') after finish() or a failed write");
  K3MOE_CHECK(w.next < w.entries.size(), w.path.string(), ": write('", name, "'): every declared tensor ",
              "was already written");
  const Entry& e = w.entries[w.next];
  K3MOE_CHECK(name == e.name, w.path.string(), ": tensors must be written in declaration order: expected '",
              e.name, "', got '", name, "'");
  K3MOE_CHECK(bytes.size() == w.sizes[w.next], w.path.string(), ": tensor '", e.name, "' ", shape_str(e.shape),
              " ", to_string(e.dtype), " is ", w.sizes[w.next], " bytes, got ", bytes.size());
  try {
    w.write_all(bytes.data(), bytes.size());
  } catch (...) {
    w.discard();
    throw;
  }
  ++w.next;
}

void SafetensorsWriter::finish() {
  Impl& w = *impl_;
  K3MOE_CHECK(w.fd >= 0, w.path.string(), ": finish() called twice or after a failed write");
  if (w.next != w.entries.size()) {
    const std::string missing = w.entries[w.next].name;
    w.discard();
    K3MOE_FAIL(w.path.string(), ": finish() before tensor '", missing, "' was written (",
               w.entries.size() - w.next, " of ", w.entries.size(), " tensors missing)");
  }
  const int rc = ::close(w.fd);
  w.fd = -1;
  if (rc != 0) {
    const int err = errno;
    ::unlink(w.partial.c_str());
    K3MOE_FAIL(w.path.string(), ": close failed: ", std::strerror(err));
  }
  if (std::rename(w.partial.c_str(), w.path.c_str()) != 0) {
    const int err = errno;
    ::unlink(w.partial.c_str());
    K3MOE_FAIL(w.path.string(), ": cannot rename ", w.partial.string(), " into place: ", std::strerror(err));
  }
}

}  // namespace k3moe
