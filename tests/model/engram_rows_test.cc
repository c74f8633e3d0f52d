// Engram rows read on the host (inference_svc/model/engram_rows.h): rows staged in the call's
// order, byte for byte and decodable as a table of their own; the page-in advice is harmless
// on a mapped file and on memory that no file backs.
#include "inference_svc/model/engram_rows.h"

#include <cstring>
#include <random>
#include <vector>

#include "common/config/config.h"
#include "common/gguf/gguf.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tools/dsflash/synth_model.h"

namespace dsflash::model {
namespace {

TEST(EngramRows, StagedRowsAreTheTableRowsInTheCallsOrder) {
  testing::TempDir dir;
  ASSERT_TRUE(tools::write_synthetic_model(tools::SynthOptions{}, dir.file("m.gguf"), 1).ok());
  auto file = gguf::Model::open(dir.file("m.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  auto cfg = config::from_gguf(**file);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  ASSERT_FALSE(cfg->engram.layer_ids.empty());
  const int l = cfg->engram.layer_ids.back();
  const gguf::TensorInfo* t = (*file)->find_tensor("blk." + std::to_string(l) + ".engram_embd.weight");
  ASSERT_NE(t, nullptr);
  auto table = kernels::weight_view(**file, *t);
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_GT(table->rows, 2);
  // Random rows, a repeat, the first and the last.
  std::mt19937_64 rng(11);
  std::vector<int64_t> ids = {table->rows - 1, 0};
  for (int i = 0; i < 45; ++i) ids.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(table->rows)));
  ids.push_back(ids[5]);
  const int64_t n = static_cast<int64_t>(ids.size());
  prefetch_rows(*table, ids.data(), n);
  std::vector<uint8_t> staged(static_cast<size_t>(n) * table->row_bytes, 0xAB);
  copy_rows(*table, ids.data(), n, staged.data());
  kernels::Weight view = *table;  // the staged rows as a table of n rows
  view.data = staged.data();
  view.rows = n;
  std::vector<float> want(static_cast<size_t>(table->cols)), got(want.size());
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(std::memcmp(staged.data() + i * table->row_bytes, table->data + ids[i] * table->row_bytes,
                          table->row_bytes),
              0)
        << "row " << i;
    kernels::decode_weight_row(*table, ids[i], want.data());
    kernels::decode_weight_row(view, i, got.data());
    EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0) << "row " << i;
  }
  // Advice on memory no file backs (the staged copy itself) changes nothing.
  const std::vector<uint8_t> before = staged;
  std::vector<int64_t> local(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) local[i] = i;
  prefetch_rows(view, local.data(), n);
  EXPECT_EQ(staged, before);
}

}  // namespace
}  // namespace dsflash::model
