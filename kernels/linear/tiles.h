// The tile layout of Q2_K, Q3_K and Q6_K weights on the device (WeightLayout::kTiles16): the
// same bytes as the GGUF rows, reordered so that a warp of the tensor-core GEMVs (gemv_mma.cu)
// reads each of its loads as one contiguous 16-byte aligned run. One definition compiled for the device readers
// (mma_common.cuh), the repack kernel (linear.cu) and the CPU (the test's reference repack).
//
// Rows go in tiles of 16 (a weight's rows must be a multiple of 16); tile i's blocks are stored
// one after another, (tile i, block b) at (i x blocks + b) x 16 x block bytes, so rows
// [16i, 16i + 16) occupy exactly the bytes they occupy in the GGUF order and a slice of whole
// tiles (an expert of a merged tensor) keeps its offset. Within a (tile, block), lane L = 4g + t
// of the mma's warp (rows g and g + 8, "a" and "b") finds what it reads at:
//   Q2_K (84-byte blocks, 1,344-byte tiles):
//     0 + 16L, 512 + 16L   qs words 8n + 2t, 8n + 2t + 1 of rows a, b (n = 0, 1): a0 b0 a1 b1
//     1024 + 8L            scale word t of rows a, b
//     1280 + 8g            d | dmin of rows a, b
//   Q3_K (110-byte blocks, 1,760-byte tiles):
//     0 + 16L, 512 + 16L   qs words 8n + t, 8n + 4 + t of rows a, b: a0 b0 a1 b1
//     1024 + 16L           hmask words t, 4 + t of rows a, b: a0 b0 a1 b1
//     1536 + 64w + 8g      scale-byte word w (0, 1, 2: bytes 96 + 4w ..) of rows a, b
//     1728 + 4g            d of rows a, b (two halves)
//   Q6_K (210-byte blocks, 3,360-byte tiles; ql word (n, h, i) = bytes 64n + 32i + 16h + 4t,
//   qh word (n, h) = bytes 128 + 32n + 16h + 4t):
//     512m + 16L           ql words (n, h, 0), (n, h, 1) of rows a, b (m = 2n + h): a0 b0 a1 b1
//     2048 + 512n + 16L    qh words (n, 0), (n, 1) of rows a, b: a0 b0 a1 b1
//     3072 + 32g           the 16 scale bytes of row a, then row b's
//     3328 + 4g            d of rows a, b (two halves)
#pragma once

#include <cstdint>

#include "kernels/hd.h"

namespace dsflash::kernels::tiles {

constexpr int kRows = 16;
constexpr int kQ2KBlock = 84, kQ3KBlock = 110, kQ6KBlock = 210;
constexpr int kQ2KTile = kRows * kQ2KBlock;  // 1,344
constexpr int kQ3KTile = kRows * kQ3KBlock;  // 1,760
constexpr int kQ6KTile = kRows * kQ6KBlock;  // 3,360

// Where byte o of row r's block (r < 16) lies in its Q2_K (tile, block).
DSF_HD inline int q2k_byte(int r, int o) {
  const int g = r & 7, which = r >> 3, in = o & 3, w = o >> 2;
  if (w < 4) return 1024 + 8 * (4 * g + w) + 4 * which + in;  // scales
  if (w < 20) {                                               // qs
    const int q = w - 4, n = q >> 3, t = (q & 7) >> 1, i = q & 1;
    return 512 * n + 16 * (4 * g + t) + 4 * (2 * i + which) + in;
  }
  return 1280 + 8 * g + 4 * which + in;  // d, dmin
}

// Where byte o of row r's block (r < 16) lies in its Q3_K (tile, block).
DSF_HD inline int q3k_byte(int r, int o) {
  const int g = r & 7, which = r >> 3;
  if (o >= 108) return 1728 + 4 * g + 2 * which + (o - 108);  // d
  const int in = o & 3, w = o >> 2;
  if (w < 8) return 1024 + 16 * (4 * g + (w & 3)) + 4 * (2 * (w >> 2) + which) + in;  // hmask
  if (w < 24) {                                                                        // qs
    const int q = w - 8, n = q >> 3, h = (q >> 2) & 1, t = q & 3;
    return 512 * n + 16 * (4 * g + t) + 4 * (2 * h + which) + in;
  }
  return 1536 + 64 * (w - 24) + 8 * g + 4 * which + in;  // scale bytes
}

// Where byte o of row r's block (r < 16) lies in its Q6_K (tile, block).
DSF_HD inline int q6k_byte(int r, int o) {
  const int g = r & 7, which = r >> 3;
  if (o >= 208) return 3328 + 4 * g + 2 * which + (o - 208);  // d
  if (o >= 192) return 3072 + 32 * g + 16 * which + (o - 192);  // scales
  const int in = o & 3, t = (o >> 2) & 3, h = (o >> 4) & 1;
  if (o < 128) {  // ql: o = 64n + 32i + 16h + 4t + in
    const int n = o >> 6, i = (o >> 5) & 1;
    return 512 * (2 * n + h) + 16 * (4 * g + t) + 4 * (2 * i + which) + in;
  }
  const int n = (o - 128) >> 5;  // qh: o = 128 + 32n + 16h + 4t + in
  return 2048 + 512 * n + 16 * (4 * g + t) + 4 * (2 * h + which) + in;
}

// Whether a type has a tile layout, and its (tile, block) bytes (0: none).
DSF_HD inline int tile_bytes(int block_bytes) {
  return block_bytes == kQ2KBlock   ? kQ2KTile
         : block_bytes == kQ3KBlock ? kQ3KTile
         : block_bytes == kQ6KBlock ? kQ6KTile
                                    : 0;
}
DSF_HD inline int tile_byte(int block_bytes, int r, int o) {
  return block_bytes == kQ2KBlock ? q2k_byte(r, o) : block_bytes == kQ3KBlock ? q3k_byte(r, o) : q6k_byte(r, o);
}

// The reference repack on the CPU: `rows` (a multiple of 16) GGUF rows of `blocks` blocks of
// block_bytes each from src into the tile order at dst (or back, to_tiles false).
inline void repack(int block_bytes, int64_t rows, int64_t blocks, const uint8_t* src, uint8_t* dst, bool to_tiles = true) {
  const int64_t row_bytes = blocks * block_bytes, tile = tile_bytes(block_bytes);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      for (int o = 0; o < block_bytes; ++o) {
        const int64_t gguf = r * row_bytes + b * block_bytes + o;
        const int64_t tiled = ((r / kRows) * blocks + b) * tile + tile_byte(block_bytes, static_cast<int>(r % kRows), o);
        if (to_tiles) {
          dst[tiled] = src[gguf];
        } else {
          dst[gguf] = src[tiled];
        }
      }
    }
  }
}

}  // namespace dsflash::kernels::tiles
