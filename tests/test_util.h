// Helpers shared by test suites: a per-test temporary directory and whole-file I/O.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dsflash::testing {

// A fresh directory under $TMPDIR removed at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "dsf_test_XXXXXX").string();
    char* p = ::mkdtemp(tmpl.data());
    if (p == nullptr) std::abort();
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

inline void write_all(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// The golden data folder: $DSF_GOLDEN_DIR if set (bundles run elsewhere), else the path
// configured at build time.
inline std::string golden_dir() {
  const char* env = std::getenv("DSF_GOLDEN_DIR");
  return env != nullptr && *env != '\0' ? env : DSF_GOLDEN_DIR;
}

}  // namespace dsflash::testing
