// Programmatic dependent launch is safe only if every kernel waits for the kernels before it
// (kernels/cuda/cuda_util.cuh: await_inputs): `launch` lets a kernel start while its
// predecessor still runs. This test reads the CUDA sources and fails on a kernel whose body
// never calls cuda::await_inputs(), or on a launch that bypasses `launch` (<<< >>>).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace {

namespace fs = std::filesystem;

std::vector<fs::path> cuda_sources() {
  std::vector<fs::path> out;
  for (const char* dir : {"kernels", "inference_svc", "expertstore_svc", "common"}) {
    const fs::path root = fs::path(DSF_SOURCE_DIR) / dir;
    if (!fs::exists(root)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      const std::string ext = e.path().extension().string();
      if (e.is_regular_file() && (ext == ".cu" || ext == ".cuh")) out.push_back(e.path());
    }
  }
  return out;
}

std::string read(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The body of the function whose declaration starts at `at`: from its first '{' to the
// matching '}'.
std::string body_at(const std::string& src, size_t at) {
  const size_t open = src.find('{', at);
  if (open == std::string::npos) return "";
  int depth = 0;
  for (size_t i = open; i < src.size(); ++i) {
    if (src[i] == '{') ++depth;
    if (src[i] == '}' && --depth == 0) return src.substr(open, i - open + 1);
  }
  return "";
}

TEST(PdlSources, EveryKernelAwaitsItsInputs) {
  const std::vector<fs::path> files = cuda_sources();
  ASSERT_FALSE(files.empty()) << "no CUDA sources under " << DSF_SOURCE_DIR;
  int kernels = 0;
  for (const fs::path& p : files) {
    const std::string src = read(p);
    for (size_t at = src.find("__global__"); at != std::string::npos; at = src.find("__global__", at + 1)) {
      ++kernels;
      const size_t line = static_cast<size_t>(std::count(src.begin(), src.begin() + at, '\n')) + 1;
      EXPECT_NE(body_at(src, at).find("cuda::await_inputs();"), std::string::npos)
          << p << ":" << line << ": a kernel that never calls cuda::await_inputs()";
    }
    EXPECT_EQ(src.find("<<<"), std::string::npos) << p << ": a launch outside cuda::launch";
  }
  EXPECT_GT(kernels, 20) << "the kernels moved? found only " << kernels;
}

}  // namespace
