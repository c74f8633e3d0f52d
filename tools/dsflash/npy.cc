// .npy format 1.0: magic, version, u16 header length, a Python-dict header padded with spaces
// and a newline to a multiple of 64 bytes, then the raw little-endian data.
#include "tools/dsflash/npy.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <regex>

#include "absl/strings/str_cat.h"

namespace dsflash::tools {

Status write_npy_f32(const std::string& path, const std::vector<float>& data, int64_t rows, int64_t cols) {
  if (static_cast<int64_t>(data.size()) != rows * cols) return absl::InvalidArgumentError("npy: data size mismatch");
  std::string header = absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': (", rows, ", ", cols, "), }");
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot create '", path, "'"));
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.write(reinterpret_cast<const char*>(&len), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * 4));
  if (!out) return absl::DataLossError(absl::StrCat("write to '", path, "' failed"));
  return absl::OkStatus();
}

StatusOr<NpyMatrix> read_npy_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  char magic[10];
  in.read(magic, 10);
  if (!in || std::string(magic, 6) != "\x93NUMPY" || magic[6] != 1) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a version-1 .npy file"));
  }
  uint16_t len;
  std::memcpy(&len, magic + 8, 2);
  std::string header(len, '\0');
  in.read(header.data(), len);
  static const std::regex kShape(R"('descr': '<f4', 'fortran_order': False, 'shape': \((\d+), (\d+)\))");
  std::smatch m;
  if (!std::regex_search(header, m, kShape)) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a 2-D little-endian float32 array"));
  }
  NpyMatrix out;
  out.rows = std::stoll(m[1].str());
  out.cols = std::stoll(m[2].str());
  out.data.resize(static_cast<size_t>(out.rows * out.cols));
  in.read(reinterpret_cast<char*>(out.data.data()), static_cast<std::streamsize>(out.data.size() * 4));
  if (!in) return absl::DataLossError(absl::StrCat("'", path, "' is truncated"));
  return out;
}

}  // namespace dsflash::tools
