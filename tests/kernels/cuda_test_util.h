// Device copies and a stream fixture for the GPU kernel tests (failures are test failures).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/exec.h"

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

// A test on its own CUDA stream, skipped without a device; dev() copies to device memory freed
// with the test.
class CudaStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kernels::cuda_available()) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    for (void* p : owned_) cudaFree(p);
    if (stream_) cudaStreamDestroy(stream_);
  }
  kernels::ExecCtx ctx() const { return kernels::ExecCtx{kernels::Backend::kCuda, stream_}; }
  template <typename T>
  T* dev(const std::vector<T>& v) {
    T* d = to_device(v);
    owned_.push_back(d);
    return d;
  }
  void sync() { ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess); }
  cudaStream_t stream_ = nullptr;
  std::vector<void*> owned_;
};

}  // namespace dsflash::testing
