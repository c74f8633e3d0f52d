// Device copies for the GPU kernel tests (failures are test failures).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"

namespace dsflash::testing {

template <typename T>
T* to_device(const std::vector<T>& v) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, std::max<size_t>(1, v.size()) * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

inline std::vector<float> to_host(const float* d, size_t n) {
  std::vector<float> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

}  // namespace dsflash::testing
