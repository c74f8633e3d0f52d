// The routed experts' FFN of a decode token in one launch (linear_experts_ffn_cuda): gate and
// up, the SwiGLU, and the down of n experts, without a grid-wide wait between the products.
//
// An expert's down reads only that expert's SwiGLU outputs, so the launch meets that
// dependency per expert: every CTA takes one work item from a counter as it starts, first the
// (expert, 64-row tile) items of the gate and up (both tiles on one split of x; the CTA forms
// the tile's SwiGLU from its own rows and then counts the item done for its expert), then the
// (expert, 128-row tile) items of the down, which wait for their expert's count before reading
// its SwiGLU outputs. Items are handed out in that order as CTAs start, so a CTA that waits
// only ever waits on items that running CTAs hold: no order of CTA scheduling can deadlock it.
// The products are the separate launches' bit for bit (the same mma_rows on the same splits,
// moe::swiglu_value). The launch's last CTA to finish zeroes the counters for the next.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/linear/gemv_mma.cuh"
#include "kernels/linear/linear_cuda.h"
#include "kernels/moe/swiglu.cuh"

namespace dsflash::kernels {
namespace {

using namespace dsflash::kernels::gemv_mma;

// The warps a row group of the gate / up and of the down, where the launch applies (what
// slices_for picks for the released model's shapes: 20 and 9 blocks).
constexpr int kGuSlices = 4, kDnSlices = 2;
constexpr int kGuRows = kExpertWarps / kGuSlices * 16, kDnRows = kExpertWarps / kDnSlices * 16;

struct ExpertFfn {
  LinearParams gate, up, down;  // expert 0's rows; gate.x: x, gate.y: a, up.y: b, down.x: a, down.y: y
  const int32_t* ids;
  const float* weights;  // [n] or null (1)
  int* counters;         // [0] next item, [1] CTAs finished, [2 + k] expert k's gate/up items done
  int64_t gate_bytes, up_bytes, down_bytes, y_stride;
  int64_t gu_blocks, dn_blocks;
  float limit;
  int n, gu_tiles, dn_tiles;
};

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void add_release(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Thread 0 waits until *count reaches `target` (an expert's gate/up items). The items it waits
// on are held by running CTAs, so it ends; a launch broken otherwise traps after 2 s (an error
// the stream reports) rather than hang.
__device__ __forceinline__ void wait_count(const int* count, int target) {
  const uint64_t start = now_ns();
  while (load_acquire(count) < target) {
    __nanosleep(64);
    if (now_ns() - start > 2000000000ull) __trap();
  }
}

// Expert k's rows of a weight (expert 0's p, experts expert_bytes apart) into y + k F.
__device__ __forceinline__ LinearParams expert_rows(const LinearParams& p, const ExpertFfn& f, int64_t expert_bytes,
                                                    int k) {
  LinearParams q = p;
  q.w += static_cast<int64_t>(f.ids[k]) * expert_bytes;
  q.y += k * p.rows;
  return q;
}

// Each operand is formed from f where it is used, so that nothing but k and tile stays live
// across the products (the loops hold 64 registers).
template <class GuBlock>
__device__ __forceinline__ void gate_up_item(const ExpertFfn& f, int k, int tile) {
  const XDigits x = split_x<GuBlock::kSub>(f.gate.x, f.gu_blocks);
  mma_rows<GuBlock, kGuSlices, kExpertWarps>(expert_rows(f.gate, f, f.gate_bytes, k), x, f.gu_blocks, tile);
  mma_rows<GuBlock, kGuSlices, kExpertWarps>(expert_rows(f.up, f, f.up_bytes, k), x, f.gu_blocks, tile);
  // mma_rows ends with the CTA in step: both tiles' rows are visible to it.
  const int64_t F = f.gate.rows, r = tile * kGuRows + threadIdx.x;
  if (threadIdx.x < kGuRows && r < F) {
    float* a = f.gate.y + k * F;
    a[r] = moe::swiglu_value(a[r], f.up.y[k * F + r], f.limit, f.weights != nullptr ? f.weights[k] : 1.0f);
    __threadfence();
  }
  __syncthreads();
  if (threadIdx.x == 0) add_release(&f.counters[2 + k], 1);
}

template <class DnBlock>
__device__ __forceinline__ void down_item(const ExpertFfn& f, int k, int tile) {
  if (threadIdx.x == 0) wait_count(&f.counters[2 + k], f.gu_tiles);
  __syncthreads();
  const XDigits x = split_x<DnBlock::kSub>(f.down.x + k * f.gate.rows, f.dn_blocks);
  LinearParams d = f.down;
  d.w += static_cast<int64_t>(f.ids[k]) * f.down_bytes;
  d.y += k * f.y_stride;
  mma_rows<DnBlock, kDnSlices, kExpertWarps>(d, x, f.dn_blocks, tile);
}

template <class GuBlock, class DnBlock>
__global__ void __launch_bounds__(kExpertWarps * 32, (min_ctas<kExpertWarps>()))
    experts_ffn_kernel(const __grid_constant__ ExpertFfn f) {
  cuda::await_inputs();
  __shared__ int item;
  if (threadIdx.x == 0) item = atomicAdd(&f.counters[0], 1);
  __syncthreads();
  const int gu_items = f.n * f.gu_tiles;
  if (item >= gu_items) {
    const int j = item - gu_items;
    down_item<DnBlock>(f, j / f.dn_tiles, j % f.dn_tiles);
  } else {
    gate_up_item<GuBlock>(f, item / f.gu_tiles, item % f.gu_tiles);
  }
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&f.counters[1], 1) == static_cast<int>(gridDim.x) - 1) {  // the last: none reads them now
      f.counters[0] = 0, f.counters[1] = 0;
      for (int k = 0; k < f.n; ++k) f.counters[2 + k] = 0;
    }
  }
}

bool tiled_k_quant(const Weight& w, int64_t expert_bytes) {
  return (w.type == quant::GgmlType::kQ2_K || w.type == quant::GgmlType::kQ3_K) &&
         w.layout == WeightLayout::kTiles16 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
         expert_bytes % 16 == 0 && w.rows > 0 && w.rows % tiles::kRows == 0 && mma_columns_fit(w.cols);
}

}  // namespace

bool linear_experts_ffn_supported(const Weight& gate, int64_t gate_bytes, const Weight& up, int64_t up_bytes,
                                  const Weight& down, int64_t down_bytes, int n) {
  static const bool on = cuda::env_int("DSF_EXPERTS_FFN", 1) != 0 && cuda::env_int("DSF_EXPERT_WARPS", kExpertWarps) == kExpertWarps;
  if (!on || n < 1 || n > kMaxExpertsFfn) return false;
  const bool same = gate.type == up.type && gate.rows == up.rows && gate.cols == up.cols && gate.row_bytes == up.row_bytes;
  if (!same || gate.type != quant::GgmlType::kQ2_K || !tiled_k_quant(gate, gate_bytes) || !tiled_k_quant(up, up_bytes) ||
      !tiled_k_quant(down, down_bytes) || down.cols != gate.rows || gate.rows % 4 != 0) {
    return false;
  }
  static const int cap = slices_cap("DSF_EXPERT_SLICES");
  return slices_for(gate.cols / 256, gate.rows / 16 * 2 * n, cap) == kGuSlices &&
         slices_for(down.cols / 256, down.rows / 16 * n, cap) == kDnSlices;
}

Status linear_experts_ffn_cuda(const ExecCtx& ctx, const Weight& gate, int64_t gate_bytes, const Weight& up,
                               int64_t up_bytes, const Weight& down, int64_t down_bytes, const int32_t* ids, int n,
                               const float* x, float limit, const float* weights, float* a, float* b, float* y,
                               int64_t y_stride, int32_t* counters) {
  if (ctx.backend != Backend::kCuda) return absl::InvalidArgumentError("linear_experts_ffn_cuda needs a CUDA context");
  if (!linear_experts_ffn_supported(gate, gate_bytes, up, up_bytes, down, down_bytes, n)) {
    return absl::UnimplementedError(absl::StrCat("linear_experts_ffn_cuda: no fused kernel for ", n, " experts of ",
                                                 gate.rows, " x ", gate.cols, " / ", down.rows, " x ", down.cols));
  }
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(a) % 16 != 0 || counters == nullptr) {
    return absl::InvalidArgumentError("linear_experts_ffn_cuda: x and a must be 16-byte aligned, counters given");
  }
  ExpertFfn f{};
  f.gate = params_of(gate, x, a, 1, OutRound::kBf16);
  f.up = params_of(up, x, b, 1, OutRound::kBf16);
  f.down = params_of(down, a, y, 1, OutRound::kBf16);
  f.ids = ids, f.weights = weights, f.counters = counters;
  f.gate_bytes = gate_bytes, f.up_bytes = up_bytes, f.down_bytes = down_bytes, f.y_stride = y_stride;
  f.gu_blocks = gate.cols / 256, f.dn_blocks = down.cols / 256;
  f.limit = limit;
  f.n = n;
  f.gu_tiles = static_cast<int>((gate.rows + kGuRows - 1) / kGuRows);
  f.dn_tiles = static_cast<int>((down.rows + kDnRows - 1) / kDnRows);
  const size_t smem = static_cast<size_t>(std::max(f.gu_blocks, f.dn_blocks) * kBlockSmem);
  const cuda::LaunchParams lp{dim3(static_cast<unsigned>(n * (f.gu_tiles + f.dn_tiles))), dim3(kExpertWarps * 32), smem,
                              cuda::stream_of(ctx)};
  if (down.type == quant::GgmlType::kQ3_K) return cuda::launch(experts_ffn_kernel<Q2KBlock<true>, Q3KBlock<true>>, lp, f);
  return cuda::launch(experts_ffn_kernel<Q2KBlock<true>, Q2KBlock<true>>, lp, f);
}

}  // namespace dsflash::kernels
