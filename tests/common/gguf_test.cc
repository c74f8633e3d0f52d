// GGUF writer -> reader round trips: every value type (nested arrays included), tensor data
// by mmap and pread, alignment, split sets opened from any shard, and the golden file.
#include <filesystem>

#include "common/gguf/gguf.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace dsflash::gguf {
namespace {

using quant::GgmlType;
using testing::TempDir;

Writer sample_writer(uint64_t alignment = kDefaultAlignment) {
  Writer w(alignment);
  w.set("general.architecture", Value::str("test"));
  w.set("u8", Value::u8(200));
  w.set("i8", Value::i8(-5));
  w.set("u16", Value::u16(65000));
  w.set("i16", Value::i16(-30000));
  w.set("u32", Value::u32(4000000000u));
  w.set("i32", Value::i32(-2000000000));
  w.set("u64", Value::u64(76632096046245ull));
  w.set("i64", Value::i64(-9000000000000ll));
  w.set("f32", Value::f32(1e-20f));
  w.set("f64", Value::f64(3.25));
  w.set("bool", Value::boolean(true));
  w.set("ints", Value::array<int32_t>(ValueType::kI32, {0, 2, -2, 1}));
  w.set("strings", Value::string_array({"a", "", "héllo", std::string("nul\0in", 6)}));
  w.set("nested", Value::nested_array(ValueType::kArray,
                                      {Value::array<uint64_t>(ValueType::kU64, {1, 2}), Value::string_array({"x"})}));
  std::vector<float> a(64), b(512);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) * 0.5f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 7) - 3.0f;
  EXPECT_TRUE(w.add_tensor_f32("t.f32", {64}, GgmlType::kF32, a).ok());
  EXPECT_TRUE(w.add_tensor_f32("t.q8", {32, 16}, GgmlType::kQ8_0, b).ok());
  EXPECT_TRUE(w.add_tensor_f32("t.bf16", {8, 8}, GgmlType::kBF16, a).ok());
  EXPECT_TRUE(w.add_tensor_f32("t.q2k", {256, 2}, GgmlType::kQ2_K, b).ok());
  return w;
}

TEST(Gguf, RoundTripsEveryValueType) {
  TempDir dir;
  Writer w = sample_writer();
  ASSERT_TRUE(w.write(dir.file("m.gguf")).ok());
  auto f = File::open(dir.file("m.gguf"));
  ASSERT_TRUE(f.ok()) << f.status();
  const File& file = **f;
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(*file.find("u8")->as_u64(), 200u);
  EXPECT_EQ(*file.find("i8")->as_i64(), -5);
  EXPECT_EQ(*file.find("u16")->as_u64(), 65000u);
  EXPECT_EQ(*file.find("i16")->as_i64(), -30000);
  EXPECT_EQ(*file.find("u32")->as_u64(), 4000000000u);
  EXPECT_EQ(*file.find("i32")->as_i64(), -2000000000);
  EXPECT_EQ(*file.find("u64")->as_u64(), 76632096046245ull);
  EXPECT_EQ(*file.find("i64")->as_i64(), -9000000000000ll);
  EXPECT_FALSE(file.find("i64")->as_u64().has_value());
  EXPECT_EQ(*file.find("f32")->as_f64(), static_cast<double>(1e-20f));
  EXPECT_EQ(*file.find("f64")->as_f64(), 3.25);
  EXPECT_EQ(*file.find("bool")->as_bool(), true);
  EXPECT_EQ(*file.find("ints")->ints(), (std::vector<int64_t>{0, 2, -2, 1}));
  EXPECT_FALSE(file.find("ints")->u64s().ok());  // -2 is negative
  ASSERT_EQ(file.find("strings")->strings().size(), 4u);
  EXPECT_EQ(file.find("strings")->strings()[2], "héllo");
  EXPECT_EQ(file.find("strings")->strings()[3], std::string("nul\0in", 6));
  const Value* nested = file.find("nested");
  ASSERT_EQ(nested->elems().size(), 2u);
  EXPECT_EQ(*nested->elems()[0].u64s(), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(nested->elems()[1].strings()[0], "x");
  EXPECT_EQ(*file.find("general.architecture")->as_string(), "test");
  EXPECT_EQ(file.find("missing"), nullptr);

  ASSERT_EQ(file.tensors().size(), 4u);
  const TensorInfo* t = file.find_tensor("t.q8");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->ne, (std::vector<uint64_t>{32, 16}));
  EXPECT_EQ(t->n_bytes, 16u * 34u);
  EXPECT_EQ(t->file_offset % 32, 0u);
  std::vector<float> vals(512);
  ASSERT_TRUE(quant::decode_row(t->type, *file.data(*t), vals.data(), 512).ok());
  for (size_t i = 0; i < vals.size(); ++i) EXPECT_NEAR(vals[i], static_cast<float>(i % 7) - 3.0f, 0.5 * 3.0 / 127 + 1e-3);
  // pread gives the same bytes as the mapping.
  std::vector<uint8_t> raw(t->n_bytes);
  ASSERT_TRUE(file.pread(t->file_offset, raw.data(), raw.size()).ok());
  EXPECT_EQ(0, std::memcmp(raw.data(), *file.data(*t), raw.size()));
  EXPECT_FALSE(file.pread(file.file_size() - 4, raw.data(), 8).ok());
}

TEST(Gguf, HonoursAlignmentAndPreadOnlyMode) {
  TempDir dir;
  Writer w = sample_writer(64);
  ASSERT_TRUE(w.write(dir.file("a.gguf")).ok());
  auto f = File::open(dir.file("a.gguf"), File::Options{.map = false});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->alignment(), 64u);
  EXPECT_EQ((*f)->data_offset() % 64, 0u);
  for (const auto& t : (*f)->tensors()) EXPECT_EQ(t.offset % 64, 0u) << t.name;
  EXPECT_EQ((*f)->data(*(*f)->find_tensor("t.f32")).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(Gguf, SplitSetOpensFromAnyShard) {
  TempDir dir;
  Writer w = sample_writer();
  auto paths = w.write_split(dir.file("m"), 3);
  ASSERT_TRUE(paths.ok()) << paths.status();
  ASSERT_EQ(paths->size(), 3u);
  EXPECT_EQ((*paths)[1], dir.file("m-00002-of-00003.gguf"));
  for (const auto& p : *paths) {
    auto m = Model::open(p);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->n_shards(), 3u);
    EXPECT_EQ((*m)->tensors().size(), 4u);
    EXPECT_EQ(*(*m)->find("u16")->as_u64(), 65000u);  // metadata from shard 1
    const TensorInfo* t = (*m)->find_tensor("t.q2k");
    ASSERT_NE(t, nullptr);
    std::vector<uint8_t> bytes(t->n_bytes);
    ASSERT_TRUE((*m)->read(*t, 0, bytes.data(), bytes.size()).ok());
    EXPECT_FALSE((*m)->read(*t, 1, bytes.data(), bytes.size()).ok());
  }
  // The shards really split the tensors.
  auto last = File::open((*paths)[2]);
  ASSERT_TRUE(last.ok());
  EXPECT_LT((*last)->tensors().size(), 4u);
  EXPECT_EQ(*(*last)->find("split.no")->as_u64(), 2u);
}

TEST(Gguf, SplitSetMissingShardIsNamed) {
  TempDir dir;
  Writer w = sample_writer();
  auto paths = w.write_split(dir.file("m"), 3);
  ASSERT_TRUE(paths.ok());
  std::filesystem::remove((*paths)[1]);
  auto m = Model::open((*paths)[0]);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("shard 2 of 3 is missing"), std::string::npos) << m.status();
}

TEST(Gguf, SplitSetWithMismatchedShardIsRejected) {
  TempDir dir;
  Writer w = sample_writer();
  auto paths = w.write_split(dir.file("m"), 2);
  ASSERT_TRUE(paths.ok());
  // A shard renamed into a set it does not belong to.
  std::filesystem::rename((*paths)[1], dir.file("x-00002-of-00002.gguf"));
  std::filesystem::copy_file((*paths)[0], dir.file("x-00001-of-00002.gguf"));
  std::filesystem::copy_file(dir.file("x-00002-of-00002.gguf"), (*paths)[1]);
  std::filesystem::copy_file((*paths)[0], dir.file("y-00002-of-00002.gguf"));
  std::filesystem::copy_file((*paths)[0], dir.file("y-00001-of-00002.gguf"));
  auto m = Model::open(dir.file("y-00001-of-00002.gguf"));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("split.no 0"), std::string::npos) << m.status();
}

// FNV-1a is enough to notice a different file; the README gives the sha256.
TEST(Gguf, GoldenFileIsTheRecordedOne) {
  const auto bytes = testing::read_all(testing::golden_dir() + "/tiny_a.gguf");
  ASSERT_EQ(bytes.size(), 7002368u);
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : bytes) h = (h ^ b) * 1099511628211ull;
  EXPECT_EQ(h, 18125841292849222742ull);
}

TEST(Gguf, GoldenFileParses) {
  auto m = Model::open(testing::golden_dir() + "/tiny_a.gguf");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->tensors().size(), 170u);
  EXPECT_EQ((*m)->metadata().size(), 78u);
  EXPECT_EQ(*(*m)->find("general.architecture")->as_string(), "deepseek41");
  const TensorInfo* t = (*m)->find_tensor("blk.0.ffn_gate_exps.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->type, GgmlType::kMXFP4);
  EXPECT_EQ(t->ne, (std::vector<uint64_t>{256, 128, 4}));
  EXPECT_EQ((*m)->find("deepseek41.engram.token_map")->size(), 512u);
}

}  // namespace
}  // namespace dsflash::gguf
