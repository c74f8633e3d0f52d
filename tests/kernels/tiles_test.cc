// The tile layout of Q2_K, Q3_K and Q6_K weights (kernels/linear/tiles.h, the map the CUDA readers and
// the repack kernel use): each (row, byte) of a tile's 16 blocks has its own place and every
// place is taken, a matrix goes to tiles and back unchanged, tiles keep their rows' byte range,
// and what a lane reads at the documented offsets is the bytes its GGUF reader took.
#include "kernels/linear/tiles.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace dsflash::kernels {
namespace {

TEST(Tiles, EachTypeMapsItsBlocksOntoTheTileOneToOne) {
  for (const int block : {tiles::kQ2KBlock, tiles::kQ3KBlock, tiles::kQ6KBlock}) {
    const int tile = tiles::tile_bytes(block);
    ASSERT_EQ(tile, 16 * block);
    ASSERT_EQ(tile % 16, 0);
    std::vector<int> hits(tile, 0);
    for (int r = 0; r < 16; ++r) {
      for (int o = 0; o < block; ++o) {
        const int at = tiles::tile_byte(block, r, o);
        ASSERT_GE(at, 0) << block << " r " << r << " o " << o;
        ASSERT_LT(at, tile) << block << " r " << r << " o " << o;
        ++hits[at];
      }
    }
    for (int i = 0; i < tile; ++i) EXPECT_EQ(hits[i], 1) << block << " byte " << i;
  }
  EXPECT_EQ(tiles::tile_bytes(144), 0);  // Q4_K: no tile layout
}

TEST(Tiles, RepackRoundTripsAndKeepsEachTilesRows) {
  std::mt19937 rng(5);
  for (const int block : {tiles::kQ2KBlock, tiles::kQ3KBlock, tiles::kQ6KBlock}) {
    const int64_t rows = 48, blocks = 3, row_bytes = blocks * block;
    std::vector<uint8_t> src(rows * row_bytes), tiled(src.size()), back(src.size());
    for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
    tiles::repack(block, rows, blocks, src.data(), tiled.data());
    EXPECT_NE(std::memcmp(src.data(), tiled.data(), src.size()), 0);
    tiles::repack(block, rows, blocks, tiled.data(), back.data(), false);
    EXPECT_EQ(std::memcmp(src.data(), back.data(), src.size()), 0);
    // Tile 1 (rows 16..31) alone gives the same bytes as tile 1 of the whole matrix.
    std::vector<uint8_t> one(16 * row_bytes);
    tiles::repack(block, 16, blocks, src.data() + 16 * row_bytes, one.data());
    EXPECT_EQ(std::memcmp(one.data(), tiled.data() + 16 * row_bytes, one.size()), 0);
  }
}

uint32_t word(const uint8_t* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}

// Lane (g, t)'s loads from a (tile, block) against the words of rows g and g + 8 in GGUF order
// that the GGUF readers take (mma_common.cuh's Q2KRows, gemv_mma.cu's Q3KBlock::Row and
// Q6KBlock::Row).
TEST(Tiles, LanesFindTheirGgufWordsWhereTheReadersLoadThem) {
  std::mt19937 rng(9);
  for (const int block : {tiles::kQ2KBlock, tiles::kQ3KBlock, tiles::kQ6KBlock}) {
    std::vector<uint8_t> src(16 * block), tile(src.size());
    for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
    tiles::repack(block, 16, 1, src.data(), tile.data());
    for (int g = 0; g < 8; ++g) {
      for (int t = 0; t < 4; ++t) {
        const int lane = 4 * g + t;
        const uint8_t *a = src.data() + g * block, *b = src.data() + (g + 8) * block, *tl = tile.data();
        if (block == tiles::kQ2KBlock) {
          for (int n = 0; n < 2; ++n) {
            const int w = 16 + 32 * n + 8 * t;  // qs[32n + 8t ..]
            EXPECT_EQ(word(tl + 512 * n + 16 * lane), word(a + w));
            EXPECT_EQ(word(tl + 512 * n + 16 * lane + 4), word(b + w));
            EXPECT_EQ(word(tl + 512 * n + 16 * lane + 8), word(a + w + 4));
            EXPECT_EQ(word(tl + 512 * n + 16 * lane + 12), word(b + w + 4));
          }
          EXPECT_EQ(word(tl + 1024 + 8 * lane), word(a + 4 * t));
          EXPECT_EQ(word(tl + 1024 + 8 * lane + 4), word(b + 4 * t));
          EXPECT_EQ(word(tl + 1280 + 8 * g), word(a + 80));
          EXPECT_EQ(word(tl + 1280 + 8 * g + 4), word(b + 80));
        } else if (block == tiles::kQ6KBlock) {
          for (int n = 0; n < 2; ++n) {
            for (int h = 0; h < 2; ++h) {
              for (int i = 0; i < 2; ++i) {  // ql word (n, h, i)
                const int w = 64 * n + 32 * i + 16 * h + 4 * t;
                EXPECT_EQ(word(tl + 512 * (2 * n + h) + 16 * lane + 8 * i), word(a + w));
                EXPECT_EQ(word(tl + 512 * (2 * n + h) + 16 * lane + 8 * i + 4), word(b + w));
              }
              const int w = 128 + 32 * n + 16 * h + 4 * t;  // qh word (n, h)
              EXPECT_EQ(word(tl + 2048 + 512 * n + 16 * lane + 8 * h), word(a + w));
              EXPECT_EQ(word(tl + 2048 + 512 * n + 16 * lane + 8 * h + 4), word(b + w));
            }
          }
          EXPECT_EQ(std::memcmp(tl + 3072 + 32 * g, a + 192, 16), 0);
          EXPECT_EQ(std::memcmp(tl + 3072 + 32 * g + 16, b + 192, 16), 0);
          EXPECT_EQ(std::memcmp(tl + 3328 + 4 * g, a + 208, 2), 0);
          EXPECT_EQ(std::memcmp(tl + 3328 + 4 * g + 2, b + 208, 2), 0);
        } else {
          for (int n = 0; n < 2; ++n) {
            for (int h = 0; h < 2; ++h) {
              const int w = 32 + 32 * n + 16 * h + 4 * t;
              EXPECT_EQ(word(tl + 512 * n + 16 * lane + 8 * h), word(a + w));
              EXPECT_EQ(word(tl + 512 * n + 16 * lane + 8 * h + 4), word(b + w));
            }
          }
          for (int h = 0; h < 2; ++h) {
            EXPECT_EQ(word(tl + 1024 + 16 * lane + 8 * h), word(a + 16 * h + 4 * t));
            EXPECT_EQ(word(tl + 1024 + 16 * lane + 8 * h + 4), word(b + 16 * h + 4 * t));
          }
          for (int k = 0; k < 3; ++k) {
            EXPECT_EQ(word(tl + 1536 + 64 * k + 8 * g), word(a + 96 + 4 * k));
            EXPECT_EQ(word(tl + 1536 + 64 * k + 8 * g + 4), word(b + 96 + 4 * k));
          }
          EXPECT_EQ(tl[1728 + 4 * g], a[108]);
          EXPECT_EQ(tl[1728 + 4 * g + 1], a[109]);
          EXPECT_EQ(tl[1728 + 4 * g + 2], b[108]);
          EXPECT_EQ(tl[1728 + 4 * g + 3], b[109]);
        }
      }
    }
  }
}

}  // namespace
}  // namespace dsflash::kernels
