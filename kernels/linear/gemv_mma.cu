// Decode GEMVs (one token) on the integer tensor cores: the dense products' and the routed
// experts' launches (their kernels' parts and the method: gemv_mma.cuh).
#include <cuda_bf16.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string_view>
#include <utility>

#include "kernels/linear/gemv_mma.cuh"
#include "kernels/linear/linear_cuda.h"

namespace dsflash::kernels {
namespace gemv_mma {

// CTAs of `kernel` (threads each, smem bytes of dynamic shared memory) a SM holds; asked of the
// runtime once per (kernel, smem) and kept (the eager decode step launches ~250 of these).
StatusOr<int> resident_ctas(const void* kernel, int threads, size_t smem) {
  static std::mutex mu;
  static std::map<std::pair<const void*, size_t>, int> known;
  std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find({kernel, smem});
  if (it != known.end()) return it->second;
  int per_sm = 0;
  CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  known[{kernel, smem}] = per_sm;
  return per_sm;
}

// Warps per row group (each takes every s-th block of the group's rows; a CTA sums them): the
// power of two up to 16 that loses the least, counting both ways to lose. A warp works
// ceil(n_blocks / s) blocks while the group waits for its slowest, so an s that does not divide
// n_blocks idles warps (20 blocks on 16 slices: 62 % busy; 9 on 8: 56 %); and fewer warps than
// ~32 a SM in all leave memory bandwidth unused. The larger s wins a tie. At most max_slices.
int slices_for(int64_t n_blocks, int64_t group_products, int max_slices) {
  static const int forced = [] {  // DSF_MMA_SLICES=s, for measurement: s wherever the blocks allow
    const long long s = env_int("DSF_MMA_SLICES", 0);
    return s == 1 || s == 2 || s == 4 || s == 8 || s == 16 ? static_cast<int>(s) : 0;
  }();
  if (forced > 0 && forced <= n_blocks) return forced;
  int best = 1;
  double best_score = -1.0;
  for (int s = max_slices; s >= 1; s /= 2) {
    if (s > n_blocks) continue;
    const double busy = static_cast<double>(n_blocks) / static_cast<double>(s * ((n_blocks + s - 1) / s));
    const double fill = std::min(1.0, static_cast<double>(group_products * s) / (32.0 * sm_count()));
    if (busy * fill > best_score + 1e-9) best = s, best_score = busy * fill;
  }
  return best;
}

Status check_blocks(int64_t n_blocks) {
  if (n_blocks <= kMaxMmaBlocks) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("tensor-core GEMV: ", n_blocks * 256, " columns exceed its ", kMaxMmaBlocks * 256));
}

// The power of two in [1, 16] at most the variable `name` (16 where unset): a cap on the
// slices slices_for may choose, for measurement.
int slices_cap(const char* name) {
  const long long v = env_int(name, 16);
  int m = 1;
  while (m < 16 && 2 * m <= v) m *= 2;
  return m;
}

}  // namespace gemv_mma

namespace {

using namespace dsflash::kernels::gemv_mma;

// Products of one shape, each its own weights and x (blockIdx.y picks one).
struct MmaBatch {
  LinearParams p[kMaxGemvBatch];
  int64_t n_blocks;
  int tiles_per_cta;
};

template <class Block, int kSlices>
__global__ void __launch_bounds__(cta_warps<kSlices>() * 32) dense_mma_kernel(const __grid_constant__ MmaBatch b) {
  cuda::await_inputs();
  const LinearParams& p = b.p[blockIdx.y];
  const XDigits x = split_x<Block::kSub>(p.x, b.n_blocks);
  mma_tiles<Block, kSlices, cta_warps<kSlices>()>(p, x, b.n_blocks, b.tiles_per_cta);
}

// Experts chosen on the device: product k is expert ids[k]'s rows on x + k x_stride. With a
// second weight of the same shape (up beside gate, on one x), products n .. 2n - 1 are its
// experts ids[0 .. n) into y2.
struct ExpertMma {
  LinearParams p;  // expert 0's rows, product 0's x and y
  const int32_t* ids;
  int64_t expert_bytes, x_stride, y_stride;
  int64_t n_blocks;
  int n;              // products per weight
  const uint8_t* w2;  // the second weight's expert 0, or null
  float* y2;
  int64_t expert_bytes2;
  int tiles_per_cta;
};

// kCtaWarps: kExpertWarps (or more for more slices; DSF_EXPERT_WARPS=8, measurement: the
// earlier 8).
template <class Block, int kSlices, int kCtaWarps>
__global__ void __launch_bounds__(kCtaWarps * 32, (min_ctas<kCtaWarps>()))
    experts_mma_kernel(const __grid_constant__ ExpertMma b) {
  cuda::await_inputs();
  LinearParams p = b.p;
  int k = blockIdx.y;
  int64_t stride = b.expert_bytes;
  if (k >= b.n) k -= b.n, p.w = b.w2, p.y = b.y2, stride = b.expert_bytes2;
  p.w += static_cast<int64_t>(b.ids[k]) * stride;
  p.x += k * b.x_stride;
  p.y += k * b.y_stride;
  const XDigits x = split_x<Block::kSub>(p.x, b.n_blocks);
  mma_tiles<Block, kSlices, kCtaWarps>(p, x, b.n_blocks, b.tiles_per_cta);
}

// The launch of K<kSlices> over n products of `rows`: one wave of resident CTAs, each taking
// as many tiles as that needs (rounded up: more tiles share one digit split, and a second,
// partial wave costs a whole CTA's time; H200, the routed experts' down, 480 tiles on 264
// resident CTAs: 1.23 -> 1.15 ms a token; the step 7.68 -> 7.57 ms). A launch of fewer tiles
// than a wave keeps one a CTA (wo_b at 2 tiles a CTA, 160 CTAs, took 8 % longer than 320 CTAs
// of one).
template <template <int> class K, int kSlices, typename Arg>
Status launch_slices(int64_t rows, int64_t n_blocks, int n, cudaStream_t st, Arg arg) {
  constexpr int kCtaWarps = K<kSlices>::kCtaWarps;
  constexpr int64_t kTileRows = kCtaWarps / kSlices * 16;  // as mma_tiles
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
  const size_t smem = static_cast<size_t>(n_blocks * kBlockSmem);
  ASSIGN_OR_RETURN(const int per_sm, resident_ctas(reinterpret_cast<const void*>(K<kSlices>::fn), kCtaWarps * 32, smem));
  const int64_t wave = std::max<int64_t>(1, static_cast<int64_t>(per_sm) * sm_count());
  arg.tiles_per_cta = static_cast<int>(std::max<int64_t>(1, (tiles * n + wave - 1) / wave));  // >= 1: rows may be 0
  const int64_t ctas = (tiles + arg.tiles_per_cta - 1) / arg.tiles_per_cta;
  return cuda::launch(K<kSlices>::fn,
                      cuda::LaunchParams{dim3(static_cast<unsigned>(ctas), static_cast<unsigned>(n)),
                                         dim3(kCtaWarps * 32), smem, st},
                      arg);
}

template <template <int> class K, typename Arg>
Status launch_mma(int64_t rows, int64_t n_blocks, int n, cudaStream_t st, const Arg& arg, int max_slices = 16) {
  switch (slices_for(n_blocks, (rows + 15) / 16 * n, max_slices)) {
    case 16: return launch_slices<K, 16>(rows, n_blocks, n, st, arg);
    case 8: return launch_slices<K, 8>(rows, n_blocks, n, st, arg);
    case 4: return launch_slices<K, 4>(rows, n_blocks, n, st, arg);
    case 2: return launch_slices<K, 2>(rows, n_blocks, n, st, arg);
    default: return launch_slices<K, 1>(rows, n_blocks, n, st, arg);
  }
}

template <class Block>
struct DenseMma {
  template <int kSlices>
  struct K {
    static constexpr auto fn = dense_mma_kernel<Block, kSlices>;
    static constexpr int kCtaWarps = cta_warps<kSlices>();
  };
};
template <class Block, int kMinCtaWarps>
struct ExpertsMma {
  template <int kSlices>
  struct K {
    static constexpr int kCtaWarps = cta_warps<kSlices>() > kMinCtaWarps ? cta_warps<kSlices>() : kMinCtaWarps;
    static constexpr auto fn = experts_mma_kernel<Block, kSlices, kCtaWarps>;
  };
};
// DSF_GEMV_MMA, for measurement: 0 the fp32 kernels only, 1 the tensor cores from ~4k (16-row
// group, block) pairs a launch, else (default 2) the tensor cores at every size.
int mma_mode() {
  static const int mode = static_cast<int>(env_int("DSF_GEMV_MMA", 2));
  return mode;
}

// Whether n products of rows x cols take the tensor cores: x's digits fit a CTA's shared
// memory (and in mode 1, the launch is large). The threshold of mode 1 was the default while
// the fp32 kernels were faster on the small products (H200: q_a 5120 -> 1280, kv 5120 -> 512,
// the shared expert's 2304 -> 5120); every size on the tensor cores now gives the shorter
// graph step (perf preset pooled: 7.03 against 7.14-7.15 ms at 9a2c817; 7.24-7.27 against
// 7.31-7.32 at 54dc8f7, on another machine).
bool mma_pays(int64_t rows, int64_t cols, int n) {
  // DSF_GEMV_MMA_MIN_PAIRS (measurement): mode 2's threshold, 0 by default.
  static const int64_t min_pairs = mma_mode() == 1 ? 4096 : env_int("DSF_GEMV_MMA_MIN_PAIRS", 0);
  if (cols / 256 > kMaxMmaBlocks || mma_mode() == 0) return false;
  return (rows + 15) / 16 * (cols / 256) * n >= min_pairs;
}

// The routed experts' launch on CTAs of at least kMinCtaWarps warps, at most `max_slices`.
template <class Block, int kMinCtaWarps>
Status launch_experts(const ExpertMma& b, int64_t rows, int products, int max_slices, cudaStream_t st) {
  return launch_mma<ExpertsMma<Block, kMinCtaWarps>::template K>(rows, b.n_blocks, products, st, b, max_slices);
}

}  // namespace

bool gemv_mma_applies(const LinearParams* p, int n) { return mma_pays(p[0].rows, p[0].cols, n); }

Status launch_dense_mma(const ExecCtx& ctx, quant::GgmlType type, const LinearParams* p, int n) {
  MmaBatch b{};
  b.n_blocks = p[0].cols / 256;
  RETURN_IF_ERROR(check_blocks(b.n_blocks));
  for (int i = 0; i < n; ++i) b.p[i] = p[i];
  // At most 16 slices (DSF_MMA_Q4K_SLICES, for measurement). At 6cca49b 8 was better (the
  // attention output's products and the shared expert's gate and up 2.14 ms a token against
  // 2.48 at 16, a graph step 8.34 against 8.76 ms); since the chain's small kernels shrank, 16
  // gives the shorter graph step on the H200 (7.21-7.22 against 7.25-7.27 ms, three pairs of
  // runs, 157a826), though each launch alone is slower (wo_b 17.2 against 16.3 us under ncu).
  static const int max_slices = slices_cap("DSF_MMA_Q4K_SLICES");
  const cudaStream_t st = cuda::stream_of(ctx);
  if (type == quant::GgmlType::kQ6_K) {
    if (p[0].tiles) return launch_mma<DenseMma<Q6KBlock<true>>::K>(p[0].rows, b.n_blocks, n, st, b);
    return launch_mma<DenseMma<Q6KBlock<false>>::K>(p[0].rows, b.n_blocks, n, st, b);
  }
  return launch_mma<DenseMma<Q4KBlock>::K>(p[0].rows, b.n_blocks, n, st, b, max_slices);
}

bool mma_columns_fit(int64_t cols) { return cols > 0 && cols % 256 == 0 && cols / 256 <= kMaxMmaBlocks; }

bool experts_mma_applies(quant::GgmlType type, int64_t rows, int64_t cols, int n) {
  return (type == quant::GgmlType::kQ2_K || type == quant::GgmlType::kQ3_K) && mma_pays(rows, cols, n);
}

Status launch_experts_mma(const ExecCtx& ctx, quant::GgmlType type, const LinearParams& p, const int32_t* ids,
                          int64_t expert_bytes, int n, int64_t x_stride, int64_t y_stride, const uint8_t* w2, float* y2,
                          int64_t expert_bytes2) {
  const int products = w2 != nullptr ? 2 * n : n;
  if (n > kMaxGemvBatch) return absl::InvalidArgumentError(absl::StrCat("launch_experts_mma: ", n, " products"));
  if (w2 != nullptr && x_stride != 0) return absl::InvalidArgumentError("launch_experts_mma: two weights need one x");
  const ExpertMma b{p, ids, expert_bytes, x_stride, y_stride, p.cols / 256, n, w2, y2, expert_bytes2, 1};
  RETURN_IF_ERROR(check_blocks(b.n_blocks));
  const cudaStream_t st = cuda::stream_of(ctx);
  static const bool narrow = env_int("DSF_EXPERT_WARPS", kExpertWarps) == kWarps;
  static const int max_slices = slices_cap("DSF_EXPERT_SLICES");
  if (p.tiles && p.rows % tiles::kRows != 0) {
    return absl::InvalidArgumentError(absl::StrCat("launch_experts_mma: tiles of ", p.rows, " rows"));
  }
  const auto run = [&]<class Block>() {
    if (narrow) return launch_experts<Block, kWarps>(b, p.rows, products, max_slices, st);
    return launch_experts<Block, kExpertWarps>(b, p.rows, products, max_slices, st);
  };
  if (type == quant::GgmlType::kQ3_K) {
    return p.tiles ? run.template operator()<Q3KBlock<true>>() : run.template operator()<Q3KBlock<false>>();
  }
  return p.tiles ? run.template operator()<Q2KBlock<true>>() : run.template operator()<Q2KBlock<false>>();
}

}  // namespace dsflash::kernels
