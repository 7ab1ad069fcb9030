// The safetensors reader and writer: round trips, the writer's rules, and a mutation fuzzer of the
// header parser (every mutated file either parses into in-bounds tensors or throws k3moe::Error).
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_test_util.h"
#include "k3moe/error.h"
#include "k3moe/safetensors.h"

namespace k3moe {
namespace {

using testing::expect_error;
using testing::le64;
using testing::read_bytes;
using testing::split_safetensors;
using testing::TempDir;

std::vector<uint8_t> pattern_bytes(size_t n, uint8_t salt) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(i * 131 + salt);
  return v;
}

struct Sample {
  SafetensorsWriter::Entry entry;
  std::vector<uint8_t> bytes;
};

std::vector<Sample> sample_tensors() {
  return {{{"weight.packed", Dtype::U8, {3, 5}}, pattern_bytes(15, 1)},
          {{"gate", Dtype::BF16, {4, 3}}, pattern_bytes(24, 2)},
          {{"bias", Dtype::F32, {7}}, pattern_bytes(28, 3)},
          {{"empty", Dtype::I32, {0, 4}}, {}},
          {{"scalar", Dtype::F64, {}}, pattern_bytes(8, 4)},
          {{"counts", Dtype::I64, {2, 1, 2}}, pattern_bytes(32, 5)},
          {{"fp8", Dtype::F8_E4M3, {9}}, pattern_bytes(9, 6)}};
}

void write_samples(const std::filesystem::path& path, const std::vector<Sample>& samples,
                   std::map<std::string, std::string> metadata = {{"format", "pt"}}) {
  std::vector<SafetensorsWriter::Entry> entries;
  for (const Sample& s : samples) entries.push_back(s.entry);
  SafetensorsWriter w(path, entries, metadata);
  for (const Sample& s : samples) w.write(s.entry.name, s.bytes);
  w.finish();
}

void expect_samples(const SafetensorsFile& f, const std::vector<Sample>& samples) {
  ASSERT_EQ(f.tensors().size(), samples.size());
  uint64_t offset = 0;
  for (const Sample& s : samples) {  // declaration order == offset order
    const TensorInfo& t = f.get(s.entry.name);
    EXPECT_EQ(t.dtype, s.entry.dtype) << s.entry.name;
    EXPECT_EQ(t.shape, s.entry.shape) << s.entry.name;
    EXPECT_EQ(t.begin, offset) << s.entry.name;
    EXPECT_EQ(t.nbytes(), s.bytes.size()) << s.entry.name;
    offset = t.end;
    std::vector<uint8_t> copy(t.nbytes());
    f.copy_to(t, copy);
    EXPECT_EQ(copy, s.bytes) << s.entry.name;
    std::vector<uint8_t> tail(t.nbytes() / 2);  // the second half alone, from its offset
    f.read(t, t.nbytes() - tail.size(), tail);
    EXPECT_TRUE(std::equal(tail.begin(), tail.end(), s.bytes.end() - long(tail.size()))) << s.entry.name;
  }
}

TEST(Safetensors, WriteThenReadBack) {
  TempDir dir("st");
  const auto path = dir.path() / "a.safetensors";
  const auto samples = sample_tensors();
  write_samples(path, samples);

  const SafetensorsFile f = SafetensorsFile::open(path);
  expect_samples(f, samples);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.file_size(), std::filesystem::file_size(path));
  EXPECT_EQ(f.bytes_copied(), (15u + 24 + 28 + 8 + 32 + 9) + (7u + 12 + 14 + 4 + 16 + 4));  // whole + halves
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".partial"));

  const SafetensorsFile g = SafetensorsFile::from_bytes(testing::read_bytes(path), "in-memory");
  expect_samples(g, samples);
}

TEST(Safetensors, HeaderIsPaddedWithSpacesToEightBytes) {
  TempDir dir("st");
  for (int n = 1; n <= 9; ++n) {  // names of every length mod 8
    const auto path = dir.path() / ("p" + std::to_string(n) + ".safetensors");
    write_samples(path, {{{std::string(size_t(n), 'x'), Dtype::U8, {1}}, {7}}}, {});
    const auto bytes = testing::read_bytes(path);
    const uint64_t header = testing::le64(bytes.data());
    EXPECT_EQ((8 + header) % 8, 0u);
    const std::string text(bytes.begin() + 8, bytes.begin() + 8 + long(header));
    EXPECT_EQ(text.front(), '{');
    EXPECT_EQ(text.find_last_not_of(' '), text.rfind('}'));
    EXPECT_EQ(SafetensorsFile::open(path).get(std::string(size_t(n), 'x')).begin, 0u);
  }
}

TEST(Safetensors, EmptyFileOfTensors) {
  TempDir dir("st");
  const auto path = dir.path() / "none.safetensors";
  write_samples(path, {}, {});
  EXPECT_TRUE(SafetensorsFile::open(path).tensors().empty());
}

TEST(Safetensors, WriterRules) {
  TempDir dir("st");
  const auto path = dir.path() / "w.safetensors";
  const std::vector<SafetensorsWriter::Entry> two{{"a", Dtype::U8, {2}}, {"b", Dtype::F32, {1}}};
  const std::vector<uint8_t> a{1, 2}, b{1, 2, 3, 4};
  {
    SafetensorsWriter w(path, two);
    expect_error([&] { w.write("b", b); }, {"w.safetensors", "declaration order", "'a'", "'b'"});
  }
  {
    SafetensorsWriter w(path, two);
    expect_error([&] { w.write("a", b); }, {"w.safetensors", "'a'", "2 bytes", "got 4"});
  }
  {
    SafetensorsWriter w(path, two);
    w.write("a", a);
    expect_error([&] { w.finish(); }, {"w.safetensors", "'b'"});
  }
  EXPECT_FALSE(std::filesystem::exists(path));  // nothing half-written left behind
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".partial"));
  expect_error([&] { SafetensorsWriter(path, {{"a", Dtype::U8, {1}}, {"a", Dtype::U8, {1}}}); }, {"'a'", "twice"});
  expect_error([&] { SafetensorsWriter(path, {{"a", Dtype::U8, {-1}}}); }, {"'a'", "negative"});
  expect_error([&] { SafetensorsWriter(path, {{"__metadata__", Dtype::U8, {1}}}); }, {"__metadata__"});
  expect_error([&] { SafetensorsWriter(path, {{"a", Dtype::U8, {int64_t(1) << 40, int64_t(1) << 40}}}); },
               {"'a'", "too large"});
  expect_error([&] { SafetensorsWriter(dir.path() / "no" / "such" / "x.safetensors", {}); }, {"cannot create"});
}

TEST(Safetensors, ReaderLookupsAndCopies) {
  TempDir dir("st");
  const auto path = dir.path() / "r.safetensors";
  write_samples(path, sample_tensors());
  const SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.find("nope"), nullptr);
  expect_error([&] { f.get("nope"); }, {"r.safetensors", "nope", "not found"});
  std::vector<uint8_t> small(3);
  expect_error([&] { f.copy_to(f.get("bias"), small); }, {"r.safetensors", "bias", "28", "3"});
  // A range one byte past the data section (offsets count from its start, after the header).
  const uint64_t data_size = split_safetensors(read_bytes(path)).data.size();
  TensorInfo foreign = f.get("bias");
  foreign.end = data_size + 1;
  std::vector<uint8_t> large(foreign.nbytes());
  expect_error([&] { f.copy_to(foreign, large); },
               {"r.safetensors", "bias", "data section of " + std::to_string(data_size)});
  expect_error([&] { f.read(foreign, 0, small); }, {"r.safetensors", "bias", "data section"});
  // Pieces of a tensor stay inside it: bias is 28 bytes.
  expect_error([&] { f.read(f.get("bias"), 26, small); }, {"r.safetensors", "'bias'", "28 bytes", "[26, 29)"});
  expect_error([&] { f.read(f.get("bias"), 29, {}); }, {"r.safetensors", "'bias'", "[29, 29)"});
  f.read(f.get("bias"), 28, {});  // empty, at the end: nothing to read
  expect_error([&] { SafetensorsFile::open(dir.path() / "missing.safetensors"); }, {"missing.safetensors"});
  expect_error([&] { SafetensorsFile::open(dir.path()); }, {"not a regular file"});
  // A FIFO must be refused at once, not block the open until a writer comes.
  const auto fifo = dir.path() / "fifo.safetensors";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  expect_error([&] { SafetensorsFile::open(fifo); }, {"fifo.safetensors", "not a regular file"});
}

// A file changed after open() (cut short, rewritten in place or replaced, as a copy or sync
// does) is an error naming the file and the tensor when its bytes are read: not a SIGBUS, and not
// a read of the new bytes against the old header.
TEST(Safetensors, FileChangedAfterOpen) {
  TempDir dir("st");
  const auto path = dir.path() / "cut.safetensors";
  const auto samples = sample_tensors();
  write_samples(path, samples);
  const uint64_t full = std::filesystem::file_size(path);
  std::vector<uint8_t> bias(samples[2].bytes.size());
  {
    const SafetensorsFile f = SafetensorsFile::open(path);
    std::filesystem::resize_file(path, full - 4);
    const std::string sizes = std::to_string(full) + " bytes then, " + std::to_string(full - 4) + " now";
    expect_error([&] { f.copy_to(f.get("bias"), bias); }, {"cut.safetensors", "changed since", sizes, "'bias'"});
    std::filesystem::resize_file(path, 0);
    expect_error([&] { f.copy_to(f.get("bias"), bias); }, {"cut.safetensors", "bytes then, 0 now"});
  }
  write_samples(path, samples);
  {
    const SafetensorsFile f = SafetensorsFile::open(path);
    write_samples(dir.path() / "new.safetensors", samples);  // the same bytes, another file
    std::filesystem::rename(dir.path() / "new.safetensors", path);
    expect_error([&] { f.copy_to(f.get("bias"), bias); }, {"cut.safetensors", "another file", "'bias'"});
  }
  {
    const SafetensorsFile f = SafetensorsFile::open(path);
    std::filesystem::last_write_time(path, std::filesystem::last_write_time(path) + std::chrono::seconds(5));
    expect_error([&] { f.copy_to(f.get("bias"), bias); }, {"cut.safetensors", "rewritten"});
    std::filesystem::remove(path);
    expect_error([&] { f.copy_to(f.get("bias"), bias); }, {"cut.safetensors", "cannot open it again", "'bias'"});
  }
}

// An open file holds no descriptor: a checkpoint of more shards than the process may keep open
// still loads.
TEST(Safetensors, OpenFilesHoldNoDescriptor) {
  TempDir dir("st");
  const auto path = dir.path() / "a.safetensors";
  const auto samples = sample_tensors();
  write_samples(path, samples);
  auto descriptors = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/fd"), std::filesystem::directory_iterator{});
  };
  const auto before = descriptors();
  std::vector<SafetensorsFile> files;
  for (int i = 0; i < 64; ++i) files.push_back(SafetensorsFile::open(path));
  EXPECT_EQ(descriptors(), before);
  for (const SafetensorsFile& f : files) expect_samples(f, samples);
  EXPECT_EQ(descriptors(), before);
}

TEST(Safetensors, DtypeNames) {
  for (Dtype d : {Dtype::BOOL, Dtype::U8, Dtype::I8, Dtype::U16, Dtype::I16, Dtype::U32, Dtype::I32, Dtype::U64,
                  Dtype::I64, Dtype::F16, Dtype::BF16, Dtype::F32, Dtype::F64, Dtype::F8_E4M3, Dtype::F8_E5M2})
    EXPECT_EQ(parse_dtype(to_string(d)), d);
  EXPECT_EQ(dtype_size(Dtype::BF16), 2);
  EXPECT_EQ(dtype_size(Dtype::F64), 8);
  EXPECT_EQ(dtype_size(Dtype::F8_E5M2), 1);
  expect_error([] { parse_dtype("U4"); }, {"U4"});
}

TEST(Safetensors, AcceptsWhatTheSpecAllows) {
  // A header with leading/trailing whitespace, keys in any order, empty tensors at the boundaries
  // between tensors and at the data section's ends (they occupy no bytes).
  const std::string header =
      R"(  {"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},"__metadata__":{},)"
      R"("a":{"shape":[2],"dtype":"U16","data_offsets":[0,4]},"z":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},)"
      R"("e":{"dtype":"F32","shape":[3,0],"data_offsets":[4,4]},)"
      R"("f":{"dtype":"U8","shape":[0],"data_offsets":[6,6]}}   )";
  const auto f = SafetensorsFile::from_bytes(testing::raw_safetensors(header, pattern_bytes(6, 0)), "ok");
  ASSERT_EQ(f.tensors().size(), 5u);
  EXPECT_EQ(f.tensors()[1].name, "a");
  EXPECT_EQ(f.get("b").begin, 4u);
  EXPECT_EQ(f.get("e").nbytes(), 0u);
  EXPECT_EQ(SafetensorsFile::from_bytes(testing::raw_safetensors("{}", {}), "none").tensors().size(), 0u);
}

// Header-level rejections (the checkpoint corpus covers them again through the loader).
TEST(Safetensors, RejectsMalformedHeaders) {
  const std::vector<uint8_t> data = pattern_bytes(16, 0);
  const std::string good = R"({"t":{"dtype":"U8","shape":[4,4],"data_offsets":[0,16]}})";
  auto image = [&](const std::string& header) { return testing::raw_safetensors(header, data); };
  struct Case {
    const char* what;
    std::vector<uint8_t> bytes;
    std::vector<std::string> needles;
  };
  std::vector<uint8_t> short_file{1, 2, 3};
  std::vector<uint8_t> past_end = image(good);
  testing::put_le64(past_end.data(), past_end.size());
  std::vector<uint8_t> zero = image(good);
  testing::put_le64(zero.data(), 0);
  std::vector<uint8_t> huge = image(good);
  testing::put_le64(huge.data(), uint64_t(1) << 63);
  const std::vector<Case> cases{
      {"shorter than 8 bytes", short_file, {"f.st", "3 bytes"}},
      {"header length past the end", past_end, {"f.st", "header length", "past the end"}},
      {"header length 0", zero, {"f.st", "header length is 0"}},
      {"header length huge", huge, {"f.st", "header length", "limit"}},
      {"invalid JSON", image(R"({"t":{"dtype":"U8",)"), {"f.st", "not valid JSON"}},
      {"not UTF-8", image("{\"t\xff\":1}"), {"f.st", "not valid JSON"}},
      {"array", image("[1,2]"), {"f.st", "JSON object", "array"}},
      {"entry not an object", image(R"({"t":[1]})"), {"f.st", "'t'", "object"}},
      {"dtype missing", image(R"({"t":{"shape":[16],"data_offsets":[0,16]}})"), {"'t'", "'dtype' missing"}},
      {"dtype not a string", image(R"({"t":{"dtype":1,"shape":[16],"data_offsets":[0,16]}})"), {"'t'", "dtype"}},
      {"unknown dtype", image(R"({"t":{"dtype":"U4","shape":[32],"data_offsets":[0,16]}})"), {"'t'", "U4"}},
      {"shape missing", image(R"({"t":{"dtype":"U8","data_offsets":[0,16]}})"), {"'t'", "'shape' missing"}},
      {"negative shape", image(R"({"t":{"dtype":"U8","shape":[-4,-4],"data_offsets":[0,16]}})"), {"'t'", "negative"}},
      {"float shape", image(R"({"t":{"dtype":"U8","shape":[4.0,4],"data_offsets":[0,16]}})"), {"'t'", "integers"}},
      {"shape overflow", image(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})"),
       {"'t'", "overflow"}},
      {"size != numel * dtype", image(R"({"t":{"dtype":"F32","shape":[4,4],"data_offsets":[0,16]}})"),
       {"'t'", "64 bytes", "hold 16"}},
      {"offsets missing", image(R"({"t":{"dtype":"U8","shape":[16]}})"), {"'t'", "'data_offsets' missing"}},
      {"three offsets", image(R"({"t":{"dtype":"U8","shape":[16],"data_offsets":[0,16,16]}})"),
       {"'t'", "[begin, end]"}},
      {"negative offset", image(R"({"t":{"dtype":"U8","shape":[16],"data_offsets":[-1,15]}})"),
       {"'t'", "non-negative"}},
      {"offset beyond 2^64", image(R"({"t":{"dtype":"U8","shape":[0],"data_offsets":[18446744073709551616,0]}})"),
       {"'t'", "non-negative integers"}},
      {"begin > end", image(R"({"t":{"dtype":"U8","shape":[0],"data_offsets":[16,0]}})"), {"'t'", "begin > end"}},
      {"offsets out of range", image(R"({"t":{"dtype":"U8","shape":[16],"data_offsets":[8,24]}})"),
       {"'t'", "past the data section"}},
      {"overlap", image(R"({"t":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                        R"("u":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})"),
       {"'t'", "'u'", "overlap"}},
      {"empty tensor inside another", image(R"({"t":{"dtype":"U8","shape":[16],"data_offsets":[0,16]},)"
                                            R"("e":{"dtype":"U8","shape":[0],"data_offsets":[4,4]}})"),
       {"'t'", "'e'", "overlap"}},
      {"hole", image(R"({"t":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                     R"("u":{"dtype":"U8","shape":[8],"data_offsets":[8,16]}})"),
       {"f.st", "bytes [4, 8)", "'u'", "no holes"}},
      {"hole before the first", image(R"({"u":{"dtype":"U8","shape":[8],"data_offsets":[8,16]}})"),
       {"f.st", "bytes [0, 8)", "'u'", "no holes"}},
      {"trailing bytes", image(R"({"t":{"dtype":"U8","shape":[12],"data_offsets":[0,12]}})"),
       {"f.st", "cover 12 bytes of the 16-byte", "last 4"}},
      {"no tensors but bytes", image("{}"), {"f.st", "cover 0 bytes of the 16-byte"}},
      {"duplicate name", image(R"({"t":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                               R"("t":{"dtype":"U8","shape":[8],"data_offsets":[8,16]}})"),
       {"'t'", "twice"}},
      {"duplicate field in an entry", image(R"({"t":{"dtype":"U8","dtype":"I8","shape":[8],"data_offsets":[0,8]}})"),
       {"'dtype'", "twice"}},
      {"duplicate metadata key", image(R"({"__metadata__":{"format":"pt","format":"np"}})"), {"'format'", "twice"}},
      {"NUL hides the rest", image(std::string(R"({"t":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})") + '\0' +
                                   R"(,"u":{"dtype":"U8","shape":[8],"data_offsets":[8,16]}})"),
       {"f.st", "NUL byte at offset 53"}},
      {"metadata not strings", image(R"({"__metadata__":{"format":1}})"), {"__metadata__", "format"}},
      {"metadata not an object", image(R"({"__metadata__":"pt"})"), {"__metadata__"}},
      {"byte order mark", image("\xEF\xBB\xBF" + good), {"f.st", "byte order mark"}},
  };
  for (const Case& c : cases) expect_error([&] { SafetensorsFile::from_bytes(c.bytes, "f.st"); }, c.needles, c.what);
}

// A million-deep nesting must be an error, not a stack overflow in an error message.
TEST(Safetensors, RejectsDeepNestingWithoutOverflowingTheStack) {
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  for (const std::string& header : {"{\"t\":" + deep + "}", "{\"t\":{\"dtype\":\"U8\",\"shape\":" + deep + "}}",
                                    "{\"__metadata__\":{\"k\":" + deep + "}}", deep})
    expect_error([&] { SafetensorsFile::from_bytes(testing::raw_safetensors(header, {}), "deep.st"); },
                 {"deep.st", "nested deeper than"});
}

// ------------------------------------------------------------------------------------ fuzzer

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  void mutate(std::vector<uint8_t>& b) {
    const size_t header_end = b.size() >= 8 ? size_t(std::min<uint64_t>(testing::le64(b.data()) + 8, b.size())) : 0;
    switch (pick(8)) {
      case 0: {  // flip a bit, mostly inside the header
        if (b.empty()) return;
        const size_t at = pick(4) ? pick(std::max<size_t>(header_end, 1)) : pick(b.size());
        b[std::min(at, b.size() - 1)] ^= uint8_t(1u << pick(8));
        break;
      }
      case 1: {  // a structural character
        if (header_end <= 8) return;
        static const char kChars[] = "{}[]\":,-0123456789e.E+ \\u\0\xff";
        b[8 + pick(header_end - 8)] = uint8_t(kChars[pick(sizeof kChars - 1)]);
        break;
      }
      case 2:  // truncate
        b.resize(pick(b.size() + 1));
        break;
      case 3: {  // splice an interesting number over a number of the header
        if (header_end <= 8) return;
        std::string text(b.begin() + 8, b.begin() + long(header_end));
        size_t at = text.find_first_of("0123456789", pick(text.size()));
        if (at == std::string::npos) return;
        size_t end = text.find_first_not_of("0123456789", at);
        if (end == std::string::npos) end = text.size();
        static const char* kNumbers[] = {"0", "1", "-1", "-0", "7", "4294967296", "9223372036854775807",
                                         "9223372036854775808", "18446744073709551615", "18446744073709551616",
                                         "1e309", "1.5", "99999999999999999999999", "-9223372036854775808"};
        const std::string number = pick(3) ? kNumbers[pick(std::size(kNumbers))] : std::to_string(rng_());
        text.replace(at, end - at, number);
        set_header(b, header_end, text, pick(4) != 0);
        break;
      }
      case 4: {  // rewrite the length field
        if (b.size() < 8) return;
        const uint64_t n = testing::le64(b.data());
        const uint64_t choices[] = {0, 1, n + 1, n - 1, b.size(), b.size() - 8, uint64_t(rng_()), uint64_t(1) << 63,
                                    100'000'001};
        testing::put_le64(b.data(), choices[pick(std::size(choices))]);
        break;
      }
      case 5: {  // delete a range of the header
        if (header_end <= 9) return;
        std::string text(b.begin() + 8, b.begin() + long(header_end));
        const size_t at = pick(text.size()), len = 1 + pick(std::min<size_t>(16, text.size() - at));
        text.erase(at, len);
        set_header(b, header_end, text, pick(4) != 0);
        break;
      }
      case 6: {  // duplicate a range of the header
        if (header_end <= 9) return;
        std::string text(b.begin() + 8, b.begin() + long(header_end));
        const size_t at = pick(text.size()), len = 1 + pick(std::min<size_t>(40, text.size() - at));
        text.insert(pick(text.size()), text.substr(at, len));
        set_header(b, header_end, text, pick(4) != 0);
        break;
      }
      default: {  // a random byte anywhere
        if (b.empty()) return;
        b[pick(b.size())] = uint8_t(rng_());
        break;
      }
    }
  }

 private:
  size_t pick(size_t n) { return n == 0 ? 0 : size_t(rng_() % n); }
  // Replaces the header text, usually fixing the length field so the JSON itself gets tested.
  static void set_header(std::vector<uint8_t>& b, size_t header_end, const std::string& text, bool fix_length) {
    std::vector<uint8_t> out(b.begin(), b.begin() + 8);
    out.insert(out.end(), text.begin(), text.end());
    out.insert(out.end(), b.begin() + long(header_end), b.end());
    if (fix_length) testing::put_le64(out.data(), text.size());
    b = std::move(out);
  }
  std::mt19937_64 rng_;
};

std::vector<std::vector<uint8_t>> fuzz_seeds() {
  TempDir dir("fuzz");
  std::vector<std::vector<uint8_t>> seeds;
  write_samples(dir.path() / "a", sample_tensors());
  seeds.push_back(testing::read_bytes(dir.path() / "a"));
  write_samples(dir.path() / "b",
                {{{"model.layers.1.mlp.experts.0.w1.weight_packed", Dtype::U8, {4, 8}}, pattern_bytes(32, 9)},
                 {{"model.layers.1.mlp.experts.0.w1.weight_scale", Dtype::U8, {4, 1}}, pattern_bytes(4, 8)}},
                {});
  seeds.push_back(testing::read_bytes(dir.path() / "b"));
  return seeds;
}

// Every mutated image must either be rejected with k3moe::Error or parse into tensors that lie
// inside the image, match their dtype and shape, and tile its data section. Deterministic (fixed seed);
// K3MOE_FUZZ_ITERATIONS overrides the count for longer local runs.
TEST(SafetensorsFuzz, MutatedHeadersParseOrThrowError) {
  const char* env = std::getenv("K3MOE_FUZZ_ITERATIONS");
  const int iterations = env ? std::atoi(env) : 20000;
  const auto seeds = fuzz_seeds();
  Mutator mutator(0x5eed);
  std::mt19937 choose(7);
  int parsed = 0, rejected = 0;
  for (int it = 0; it < iterations; ++it) {
    std::vector<uint8_t> bytes = seeds[choose() % seeds.size()];
    for (int m = 0, n = 1 + int(choose() % 3); m < n; ++m) mutator.mutate(bytes);
    const size_t size = bytes.size();
    try {
      const uint64_t header_length = size >= 8 ? le64(bytes.data()) : 0;
      const SafetensorsFile f = SafetensorsFile::from_bytes(std::move(bytes), "fuzz");
      ++parsed;
      const uint64_t data_size = size - 8 - header_length;  // the parse checked that it fits
      uint64_t previous_end = 0;
      for (const TensorInfo& t : f.tensors()) {
        ASSERT_LE(t.end, data_size) << "iteration " << it << ": tensor " << t.name << " outside the data section";
        ASSERT_EQ(uint64_t(t.numel() * dtype_size(t.dtype)), t.nbytes()) << "iteration " << it;
        ASSERT_EQ(t.begin, previous_end) << "iteration " << it << ": overlap or hole at " << t.name;
        previous_end = t.end;
        std::vector<uint8_t> copy(t.nbytes()), tail(t.nbytes() / 3);
        f.copy_to(t, copy);
        f.read(t, t.nbytes() - tail.size(), tail);
        ASSERT_TRUE(std::equal(tail.begin(), tail.end(), copy.end() - long(tail.size())));
      }
      ASSERT_EQ(previous_end, data_size) << "iteration " << it << ": bytes after the last tensor";
    } catch (const Error& e) {
      ++rejected;
      ASSERT_NE(e.message().find("fuzz"), std::string::npos) << e.message();
    } catch (const std::exception& e) {
      FAIL() << "iteration " << it << ": non-k3moe exception: " << e.what();
    }
  }
  std::printf("  %d mutated files: %d parsed, %d rejected with k3moe::Error\n", iterations, parsed, rejected);
  EXPECT_GT(parsed, iterations / 50);  // the mutations do not only produce garbage...
  EXPECT_GT(rejected, iterations / 4);  // ...nor only valid files
}

}  // namespace
}  // namespace k3moe
