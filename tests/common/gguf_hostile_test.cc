// Hostile GGUF input: every malformed file must give an error naming the problem, never a
// crash, an abort or an unbounded allocation. Files are built byte by byte.
#include <random>

#include "common/gguf/gguf.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace dsflash::gguf {
namespace {

using testing::TempDir;

// Little-endian GGUF byte builder.
struct Raw {
  std::vector<uint8_t> b;
  template <typename T> Raw& pod(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Raw& str(const std::string& s) {
    pod<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    b.insert(b.end(), {'G', 'G', 'U', 'F'});
    return pod<uint32_t>(version).pod<uint64_t>(n_tensors).pod<uint64_t>(n_kv);
  }
  Raw& kv_u32(const std::string& k, uint32_t v) { return str(k).pod<uint32_t>(4).pod<uint32_t>(v); }
  Raw& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name).pod<uint32_t>(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) pod<uint64_t>(d);
    return pod<uint32_t>(type).pod<uint64_t>(offset);
  }
  Raw& pad(size_t alignment = 32, size_t extra = 0) {
    while (b.size() % alignment) b.push_back(0);
    b.insert(b.end(), extra, 0);
    return *this;
  }
};

// Writes bytes and opens them; returns the status.
Status open_bytes(const TempDir& dir, const std::vector<uint8_t>& bytes) {
  const std::string p = dir.file("h.gguf");
  testing::write_all(p, bytes);
  return File::open(p).status();
}

void expect_error(const Status& s, const std::string& fragment) {
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(fragment), std::string::npos) << "message: " << s.message();
  EXPECT_NE(s.message().find("h.gguf"), std::string::npos) << "error does not name the file: " << s.message();
}

Raw valid_two_tensors() {
  Raw r;
  r.header(2, 1).kv_u32("general.alignment", 32);
  r.tensor("a", {32}, 0, 0).tensor("b", {32, 2}, 8, 128);
  r.pad(32, 128 + 68);
  return r;
}

TEST(GgufHostile, ValidBaseOpens) {
  TempDir dir;
  EXPECT_TRUE(open_bytes(dir, valid_two_tensors().b).ok());
}

TEST(GgufHostile, EveryTruncationIsAnError) {
  TempDir dir;
  const auto full = valid_two_tensors().b;
  for (size_t n = 0; n < full.size() - 68; ++n) {  // cut before b's data ends
    const std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<long>(n));
    EXPECT_FALSE(open_bytes(dir, cut).ok()) << "truncated at " << n;
  }
}

TEST(GgufHostile, BadMagicAndVersion) {
  TempDir dir;
  auto r = valid_two_tensors();
  r.b[0] = 'X';
  expect_error(open_bytes(dir, r.b), "bad magic");
  Raw v1;
  v1.header(0, 0, 1);
  expect_error(open_bytes(dir, v1.b), "unsupported GGUF version 1");
}

TEST(GgufHostile, HugeCounts) {
  TempDir dir;
  Raw a;
  a.header(uint64_t{1} << 60, 0);
  expect_error(open_bytes(dir, a.b), "tensor count");
  Raw b;
  b.header(0, ~uint64_t{0});
  expect_error(open_bytes(dir, b.b), "metadata count");
  Raw c;  // array of 2^62 u64
  c.header(0, 1).str("arr").pod<uint32_t>(9).pod<uint32_t>(10).pod<uint64_t>(uint64_t{1} << 62);
  expect_error(open_bytes(dir, c.b), "array length");
  Raw d;  // array of 2^40 strings
  d.header(0, 1).str("arr").pod<uint32_t>(9).pod<uint32_t>(8).pod<uint64_t>(uint64_t{1} << 40);
  expect_error(open_bytes(dir, d.b), "array length");
}

TEST(GgufHostile, BadStringLengths) {
  TempDir dir;
  Raw a;
  a.header(0, 1).pod<uint64_t>(~uint64_t{0}).pad(32, 64);  // key length 2^64-1
  expect_error(open_bytes(dir, a.b), "metadata key #0: length");
  Raw b;
  b.header(0, 1).str("k").pod<uint32_t>(8).pod<uint64_t>(1000).str("short");
  expect_error(open_bytes(dir, b.b), "metadata 'k' string");
  Raw c;
  c.header(1, 0).pod<uint64_t>(5000).pad(32, 5100);  // tensor name over the limit
  expect_error(open_bytes(dir, c.b), "exceeds the limit");
}

TEST(GgufHostile, BadTypes) {
  TempDir dir;
  Raw a;
  a.header(0, 1).str("k").pod<uint32_t>(13).pod<uint32_t>(0);
  expect_error(open_bytes(dir, a.b), "invalid value type 13");
  Raw b;
  b.header(0, 1).str("k").pod<uint32_t>(9).pod<uint32_t>(77).pod<uint64_t>(0);
  expect_error(open_bytes(dir, b.b), "invalid array element type 77");
  Raw c;
  c.header(1, 0).tensor("t", {32}, 99, 0).pad(32, 128);
  expect_error(open_bytes(dir, c.b), "unknown GGML type id 99");
  Raw d;
  d.header(0, 1).str("flag").pod<uint32_t>(7).pod<uint8_t>(2);
  expect_error(open_bytes(dir, d.b), "bool value 2");
  Raw e;  // arrays nested too deep
  e.header(0, 1).str("deep").pod<uint32_t>(9);
  for (int i = 0; i < 6; ++i) e.pod<uint32_t>(9).pod<uint64_t>(1);
  e.pod<uint32_t>(0).pod<uint64_t>(0);
  expect_error(open_bytes(dir, e.b), "nested deeper");
}

TEST(GgufHostile, BadDimensions) {
  TempDir dir;
  Raw a;
  a.header(1, 0).tensor("t", {32, 1, 1, 1, 1}, 0, 0).pad(32, 256);
  expect_error(open_bytes(dir, a.b), "5 dimensions");
  Raw b;
  b.header(1, 0).tensor("t", {32, 0}, 0, 0).pad(32, 256);
  expect_error(open_bytes(dir, b.b), "ne[1] is 0");
  Raw c;
  c.header(1, 0).tensor("t", {uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0).pad(32, 256);
  expect_error(open_bytes(dir, c.b), "overflows");
  Raw d;
  d.header(1, 0).tensor("t", {100}, 10, 0).pad(32, 256);  // Q2_K rows must be multiples of 256
  expect_error(open_bytes(dir, d.b), "not a multiple");
  Raw e;
  e.header(1, 0).pod<uint64_t>(1).b.push_back('t');
  e.pod<uint32_t>(0).pad(32, 64);
  expect_error(open_bytes(dir, e.b), "0 dimensions");
}

TEST(GgufHostile, OffsetsOutOfRangeMisalignedOverlapping) {
  TempDir dir;
  Raw a;
  a.header(1, 0).tensor("t", {64}, 0, 0).pad(32, 100);  // needs 256 bytes
  expect_error(open_bytes(dir, a.b), "outside");
  Raw b;
  b.header(1, 0).tensor("t", {8}, 0, 16).pad(32, 256);
  expect_error(open_bytes(dir, b.b), "not aligned");
  Raw c;
  c.header(2, 0).tensor("a", {64}, 0, 0).tensor("b", {64}, 0, 128).pad(32, 512);
  expect_error(open_bytes(dir, c.b), "overlap");
  Raw d;
  d.header(1, 0).tensor("t", {8}, 0, ~uint64_t{0} - 31).pad(32, 64);  // aligned, wraps around
  expect_error(open_bytes(dir, d.b), "outside");
  Raw e;
  e.header(1, 0).tensor("t", {8}, 0, uint64_t{1} << 63).pad(32, 64);
  expect_error(open_bytes(dir, e.b), "outside");
}

TEST(GgufHostile, DuplicatesAndBadAlignment) {
  TempDir dir;
  Raw a;
  a.header(0, 2).kv_u32("k", 1).kv_u32("k", 2);
  expect_error(open_bytes(dir, a.b), "duplicate metadata key 'k'");
  Raw b;
  b.header(2, 0).tensor("t", {8}, 0, 0).tensor("t", {8}, 0, 32).pad(32, 64);
  expect_error(open_bytes(dir, b.b), "duplicate tensor name 't'");
  Raw c;
  c.header(0, 1).kv_u32("general.alignment", 24);
  expect_error(open_bytes(dir, c.b), "general.alignment");
  Raw d;
  d.header(0, 1).kv_u32("general.alignment", 0);
  expect_error(open_bytes(dir, d.b), "general.alignment");
}

TEST(GgufHostile, RandomMutationsNeverCrash) {
  TempDir dir;
  const auto base = valid_two_tensors().b;
  std::mt19937 rng(42);
  int rejected = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    auto m = base;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      const size_t at = rng() % 120;  // header region
      m[at] = static_cast<uint8_t>(rng());
    }
    if (!open_bytes(dir, m).ok()) ++rejected;
  }
  EXPECT_GT(rejected, 100);  // most header mutations are detected
}

TEST(GgufHostile, NotAFileOrMissing) {
  TempDir dir;
  auto missing = File::open(dir.file("nope.gguf"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  auto a_dir = File::open(dir.path());
  EXPECT_FALSE(a_dir.ok());
}

}  // namespace
}  // namespace dsflash::gguf
