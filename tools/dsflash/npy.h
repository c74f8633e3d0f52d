// Minimal NumPy .npy (format 1.0) writer and reader for little-endian float32 matrices.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace dsflash::tools {

Status write_npy_f32(const std::string& path, const std::vector<float>& data, int64_t rows, int64_t cols);

struct NpyMatrix {
  int64_t rows = 0, cols = 0;
  std::vector<float> data;
};
// Reads a 2-D '<f4' C-order array written by write_npy_f32 (or NumPy).
StatusOr<NpyMatrix> read_npy_f32(const std::string& path);

}  // namespace dsflash::tools
