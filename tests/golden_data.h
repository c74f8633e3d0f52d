// Reads ../shared/golden/tiny_a_golden.safetensors (F32 / I32 / U8 arrays) for golden tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace dsflash::testing {

struct GoldenArray {
  std::vector<int64_t> shape;
  std::vector<float> values;  // every dtype converted to float (ids are small integers)
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

class Golden {
 public:
  // Loads every array; aborts the test binary with a message if the file is unreadable.
  static const Golden& get() {
    static const Golden g(golden_dir() + "/tiny_a_golden.safetensors");
    return g;
  }
  bool has(const std::string& name) const { return arrays_.count(name) > 0; }
  const GoldenArray& at(const std::string& name) const {
    const auto it = arrays_.find(name);
    if (it == arrays_.end()) {
      ADD_FAILURE() << "golden array " << name << " missing";
      static const GoldenArray empty;
      return empty;
    }
    return it->second;
  }
  std::vector<int32_t> ints(const std::string& name) const {
    const auto& a = at(name);
    return std::vector<int32_t>(a.values.begin(), a.values.end());
  }

 private:
  explicit Golden(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return;
    uint64_t header_len = 0;
    in.read(reinterpret_cast<char*>(&header_len), 8);
    std::string header(header_len, '\0');
    in.read(header.data(), static_cast<std::streamsize>(header_len));
    const std::vector<char> data((std::istreambuf_iterator<char>(in)), {});
    const auto j = nlohmann::json::parse(header);
    for (const auto& [name, info] : j.items()) {
      if (name == "__metadata__") continue;
      GoldenArray a;
      a.shape = info["shape"].get<std::vector<int64_t>>();
      const auto off = info["data_offsets"].get<std::vector<uint64_t>>();
      const std::string dtype = info["dtype"];
      const char* p = data.data() + off[0];
      const int64_t n = a.numel();
      a.values.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        if (dtype == "F32") std::memcpy(&a.values[i], p + 4 * i, 4);
        else if (dtype == "I32") { int32_t v; std::memcpy(&v, p + 4 * i, 4); a.values[i] = static_cast<float>(v); }
        else a.values[i] = static_cast<float>(static_cast<uint8_t>(p[i]));
      }
      arrays_.emplace(name, std::move(a));
    }
  }
  std::map<std::string, GoldenArray> arrays_;
};

}  // namespace dsflash::testing
