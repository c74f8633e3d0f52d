// The dense Q4_K decode GEMV with its weights preloaded (DSF_GEMV_PRELOAD, measurement; see
// linear_cuda.h gemv_preload_tiles): each CTA copies its first tiles of rows into shared memory
// by bulk copies before it waits for the kernel before it, then multiplies them as
// gemv_mma.cu's dense kernel does.
#include <algorithm>

#include "kernels/cuda/bulk_copy.cuh"
#include "kernels/linear/gemv_mma.cuh"
#include "kernels/linear/linear_cuda.h"

namespace dsflash::kernels {
namespace gemv_mma {
namespace {

// dense_mma_kernel for Q4_K rows in the GGUF order, the CTA's first b.pre tiles copied into its
// shared memory before it waits for the kernel before (weights are no earlier kernel's output):
// they stream in while that kernel still runs, where it leaves DRAM and the SMs room (a small
// chain kernel: the hc exit before q_a, q_norm before wq_b, the attention before wo_a). Rows a
// pitch apart that is 32 mod 128 bytes, so a warp's loads of rows g = 0..7 (32 bytes each)
// fall in distinct banks. The same blocks in the same order: the products equal
// dense_mma_kernel's bit for bit.
template <int kSlices>
__global__ void __launch_bounds__(cta_warps<kSlices>() * 32) dense_preload_kernel(const __grid_constant__ MmaBatch b) {
  constexpr int kCtaWarps = cta_warps<kSlices>(), kGroups = kCtaWarps / kSlices;
  constexpr int64_t kTileRows = kGroups * 16;
  extern __shared__ __align__(128) uint8_t smem_w[];
  __shared__ uint64_t bar;
  const LinearParams& p = b.p[blockIdx.y];
  const int64_t first = static_cast<int64_t>(blockIdx.x) * b.tiles_per_cta, row0 = first * kTileRows;
  const int64_t pre_rows = max(int64_t{0}, min(b.pre * kTileRows, p.rows - row0));
  uint8_t* w = smem_w + b.w_offset;
  if (threadIdx.x == 0) {
    cuda::barrier_init(&bar);
    cuda::barrier_expect(&bar, static_cast<uint32_t>(pre_rows * p.row_bytes));
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    for (int64_t r = threadIdx.x; r < pre_rows; r += 32) {
      cuda::bulk_copy(w + r * b.pitch, p.w + (row0 + r) * p.row_bytes, static_cast<uint32_t>(p.row_bytes), &bar);
    }
  }
  cuda::await_inputs();
  const XDigits x = split_x<Q4KBlock::kSub>(p.x, b.n_blocks);
  cuda::barrier_wait(&bar, 0);
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, slice = warp % kSlices;
  for (int64_t tile = first; tile < first + b.tiles_per_cta && tile * kTileRows < p.rows; ++tile) {
    if (tile - first < b.pre) {
      const int64_t r0 = (tile * kGroups + warp / kSlices) * 16;
      const uint8_t* ba = w + (min(r0 + g, p.rows - 1) - row0) * b.pitch + slice * Q4KBlock::kBytes;
      const uint8_t* bb = w + (min(r0 + g + 8, p.rows - 1) - row0) * b.pitch + slice * Q4KBlock::kBytes;
      mma_rows_at<Q4KBlock, kSlices, kCtaWarps>(p, x, b.n_blocks, RowGroup{r0, ba, bb});
    } else {
      mma_rows<Q4KBlock, kSlices, kCtaWarps>(p, x, b.n_blocks, tile);
    }
  }
}

// The dynamic shared memory a CTA of dense_preload_kernel may take where `ctas` of them share a
// SM (with their reserved and static shared memory). 0 where the device cannot say. Of the SM's
// largest shared memory, or of DSF_PRELOAD_SM_KB (measurement: the shared memory of a smaller
// carve-out, DSF_CARVEOUT, that every kernel can share and that leaves more L1).
int64_t preload_smem_cap(int ctas) {
  static const int64_t per_sm = [] {
    int dev = 0, bytes = 0, reserved = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return int64_t{0};
    }
    const long long kb = env_int("DSF_PRELOAD_SM_KB", 0);
    if (kb > 0) bytes = static_cast<int>(std::min<long long>(bytes, kb * 1024));
    constexpr int64_t kStatic = 2048;  // mma_rows_at's partial sums (<= 1 KB) and the barrier
    return static_cast<int64_t>(bytes) - 2 * (reserved + kStatic);  // what two CTAs leave for dynamic memory
  }();
  // One CTA: what two would leave together (below the per-CTA limit, 227 KB on the H200).
  return ctas == 2 ? std::max<int64_t>(0, per_sm / 2) : std::max<int64_t>(0, per_sm);
}

// How dense_preload_kernel<kSlices> takes n products of rows x (n_blocks x 256) columns: one
// wave of two CTAs a SM (or, mode 2, of one where two cannot hold a tile beside x's digits),
// each taking per_cta tiles and preloading the first `pre` of them (as many as its shared memory
// holds). pre 0: not even one tile fits.
struct PreloadPlan {
  int64_t tiles = 0, per_cta = 0, pre = 0, pitch = 0, x_bytes = 0, smem = 0;
};
template <int kSlices>
PreloadPlan preload_plan(int64_t rows, int64_t row_bytes, int64_t n_blocks, int n, int mode) {
  constexpr int64_t kTileRows = cta_warps<kSlices>() / kSlices * 16;  // as mma_tiles
  PreloadPlan pl;
  if (row_bytes % 16 != 0 || rows <= 0 || mode <= 0) return pl;
  pl.tiles = (rows + kTileRows - 1) / kTileRows;
  pl.pitch = row_bytes + (160 - row_bytes % 128) % 128;  // 32 mod 128
  pl.x_bytes = (n_blocks * kBlockSmem + 127) / 128 * 128;
  const int64_t tile_bytes = kTileRows * pl.pitch;
  for (int ctas = 2; ctas >= (mode >= 2 ? 1 : 2) && pl.pre < 1; --ctas) {
    const int64_t wave = ctas * static_cast<int64_t>(sm_count());
    pl.per_cta = std::max<int64_t>(1, (pl.tiles * n + wave - 1) / wave);
    pl.pre = std::max<int64_t>(0, std::min(pl.per_cta, (preload_smem_cap(ctas) - pl.x_bytes) / tile_bytes));
  }
  pl.smem = pl.x_bytes + pl.pre * tile_bytes;
  return pl;
}

// dense_preload_kernel<kSlices> over n products of b.p[0]'s shape as preload_plan says; false
// (nothing launched) where it preloads nothing or the weights are not 16-byte aligned.
template <int kSlices>
StatusOr<bool> launch_preload_slices(MmaBatch b, int n, cudaStream_t st) {
  const PreloadPlan pl = preload_plan<kSlices>(b.p[0].rows, b.p[0].row_bytes, b.n_blocks, n, preload_mode());
  if (pl.pre < 1) return false;
  for (int i = 0; i < n; ++i) {
    if (reinterpret_cast<uintptr_t>(b.p[i].w) % 16 != 0) return false;
  }
  static const bool granted = [] {
    // The first call may come while a stream is captured: the attribute is no stream work.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) return false;
    const bool ok = cudaFuncSetAttribute(dense_preload_kernel<kSlices>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(preload_smem_cap(1))) == cudaSuccess;
    if (!ok) (void)cudaGetLastError();
    cudaThreadExchangeStreamCaptureMode(&mode);
    return ok;
  }();
  if (!granted) return false;
  b.tiles_per_cta = static_cast<int>(pl.per_cta);
  b.pre = static_cast<int>(pl.pre);
  b.pitch = static_cast<uint32_t>(pl.pitch);
  b.w_offset = static_cast<uint32_t>(pl.x_bytes);
  const auto ctas = static_cast<unsigned>((pl.tiles + pl.per_cta - 1) / pl.per_cta);
  RETURN_IF_ERROR(cuda::launch(dense_preload_kernel<kSlices>,
                               cuda::LaunchParams{dim3(ctas, static_cast<unsigned>(n)), dim3(cta_warps<kSlices>() * 32),
                                                  static_cast<size_t>(pl.smem), st},
                               b));
  return true;
}

// The slices of a dense Q4_K launch of n products of rows x (n_blocks x 256), as launch_dense_mma's.
int q4k_slices(int64_t rows, int64_t n_blocks, int n) {
  return slices_for(n_blocks, (rows + 15) / 16 * n, q4k_max_slices());
}

}  // namespace

// DSF_GEMV_PRELOAD (measurement, 0 by default): dense Q4_K products on dense_preload_kernel
// (1: where a tile fits two CTAs a SM; 2: else one CTA a SM too). Read at each call: the tests
// run both.
int preload_mode() { return static_cast<int>(env_int("DSF_GEMV_PRELOAD", 0)); }

StatusOr<bool> launch_preload(const MmaBatch& b, int n, cudaStream_t st) {
  return with_slices(q4k_slices(b.p[0].rows, b.n_blocks, n),
                     [&]<int kSlices>() { return launch_preload_slices<kSlices>(b, n, st); });
}

}  // namespace gemv_mma

int gemv_preload_tiles(const Weight& w, int n, int mode) {
  if (w.type != quant::GgmlType::kQ4_K || w.layout != WeightLayout::kGguf || !gemv_mma::mma_pays(w.rows, w.cols, n)) {
    return 0;
  }
  const int64_t n_blocks = w.cols / 256, rb = static_cast<int64_t>(w.row_bytes);
  return static_cast<int>(gemv_mma::with_slices(gemv_mma::q4k_slices(w.rows, n_blocks, n), [&]<int kSlices>() {
    return gemv_mma::preload_plan<kSlices>(w.rows, rb, n_blocks, n, mode).pre;
  }));
}

}  // namespace dsflash::kernels
