// Device-side pieces shared by the attention kernels (attn.cu, indexer.cu, sparse_split.cu): the
// keys a row sees, the window list entries made in a kernel (AttnWindow) and the fused RoPE
// (AttnRope).
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/rope/rope_math.cuh"

namespace dsflash::kernels::attn::detail {

// Entry j of query row t's window list for a call of S rows at pos0, window W (as
// window_index_cuda documents): a decode step's ring slots oldest first, else the last W
// positions in [ring ; this call's rows]; -1 where there is none.
__device__ __forceinline__ int32_t window_entry(int64_t pos0, int64_t S, int64_t W, int64_t t, int64_t j) {
  if (pos0 > 0 && S == 1) {
    const int64_t slot = (pos0 % W + 1 + j) % W;
    return slot > pos0 ? -1 : static_cast<int32_t>(slot);
  }
  const int64_t p = pos0 + t, first = max(int64_t{0}, p - W + 1), q = first + j, ring_rows = pos0 > 0 ? W : 0;
  return q <= p ? static_cast<int32_t>(q >= pos0 ? ring_rows + (q - pos0) : q % W) : -1;
}

// Compressed keys that query row t of a call at pos0 (a DevScalar's value and address) can see
// at compression ratio r: the groups of r positions completed by its position.
__device__ __forceinline__ int64_t visible_keys(int64_t pos0_value, const int64_t* pos0_dev, int64_t t, int64_t r) {
  return (cuda::scalar_value(pos0_value, pos0_dev) + t + 1) / r;
}

// The window part of the lists made in the kernel (AttnWindow): entries [0, ww) of row t's
// list are window_entry's, the rest idx[t][0 .. width - ww).
struct WindowArgs {
  int64_t ww, W;  // ww = 0: every entry from idx
  int64_t pos0_value;
  const int64_t* pos0_dev;
};

// Entry e of row t's list (of a call of S rows): a window entry below win.ww, else list[e - ww]
// (list: row t's part of idx); -1 = none.
__device__ __forceinline__ int32_t list_entry(const WindowArgs& win, int64_t pos0, int64_t S, int64_t t,
                                              const int32_t* list, int64_t e) {
  return e < win.ww ? window_entry(pos0, S, win.W, t, e) : list[e - win.ww];
}

// The row of index j in [kv_a (n_a rows) ; kv_b], or null for j < 0.
__device__ __forceinline__ const float* kv_row(const float* kv_a, int64_t n_a, const float* kv_b, int64_t Dh, int32_t j) {
  return j < 0 ? nullptr : j < n_a ? kv_a + j * Dh : kv_b + (j - n_a) * Dh;
}

// The fused RoPE (AttnRope) of row t's tail in shared memory, as rope_kernel rotates it.
struct RopeArgs {
  const float* freqs;  // null: none
  int half;
  int64_t pos0_value;
  const int64_t* pos0_dev;
  __device__ __forceinline__ void rotate(float* row, int64_t Dh, int64_t t, bool inverse) const {
    if (freqs == nullptr) return;
    __syncthreads();
    const float at = static_cast<float>(cuda::scalar_value(pos0_value, pos0_dev) + t);
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
      rope::detail::rotate_pair(row + Dh - 2 * half, i, at * freqs[i], inverse);
    }
  }
};

}  // namespace dsflash::kernels::attn::detail
