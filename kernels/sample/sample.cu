// Sampling kernels (see sample_cuda.h).
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cuda/functional>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/sample/sample_cuda.h"

namespace dsflash::kernels::sample {
namespace {

constexpr int kThreads = 256;          // one candidate a thread in a block of the prefix sums
constexpr int kArgmaxThreads = 1024;  // the greedy pick: one block over the vocabulary
// The pick's block totals live in its shared memory: 4,096 blocks of kThreads, 32 KB.
constexpr int64_t kMaxVocab = int64_t{4096} * kThreads;

// A 32-bit key whose unsigned order is the logits' order (-0 keyed as +0: the host compares
// them equal, so they tie and keep id order).
__device__ __forceinline__ uint32_t order_key(float l) {
  const uint32_t b = __float_as_uint(l == 0.0f ? 0.0f : l);
  return (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float key_logit(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) != 0 ? (k & 0x7fffffffu) : ~k);
}

// Weight of sorted candidate i: exp(logit / T - max / T), the division in float and the rest
// in double, as draw_reference computes it.
struct Weights {
  const uint32_t* keys;
  float t;
  double mx;
  __device__ Weights(const uint32_t* k, float temperature)
      : keys(k), t(temperature), mx(static_cast<double>(key_logit(k[0]) / temperature)) {}
  __device__ double operator()(int64_t i) const { return exp(static_cast<double>(key_logit(keys[i]) / t) - mx); }
};

using Scan = cub::BlockScan<double, kThreads>;
using MinIndex = cub::BlockReduce<int64_t, kThreads>;
union Shared {
  typename Scan::TempStorage scan;
  typename MinIndex::TempStorage reduce;
};

// This thread's inclusive prefix of block b's weights (candidates at or past n0 weigh 0). The
// block sums and every later prefix come from this one function, so they agree bit for bit.
__device__ double block_prefix(const Weights& w, int64_t b, int64_t n0, Shared& sh) {
  const int64_t i = b * kThreads + threadIdx.x;
  double out;
  Scan(sh.scan).InclusiveSum(i < n0 ? w(i) : 0.0, out);
  __syncthreads();
  return out;
}

__global__ void edit_kernel(float* logits, const Edit* edits, int n, Penalties pen) {
  cuda::await_inputs();
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) logits[edits[i].id] = edited(logits[edits[i].id], edits[i], pen);
}

struct Best {
  float v;
  int64_t at;  // -1: none
};

struct BestOf {
  __device__ Best operator()(const Best& a, const Best& b) const {
    if (a.at < 0) return b;
    if (b.at < 0) return a;
    return (b.v > a.v || (b.v == a.v && b.at < a.at)) ? b : a;
  }
};

__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const float* logits, int64_t V, int32_t* out) {
  cuda::await_inputs();
  Best best{0.0f, -1};
  for (int64_t i = threadIdx.x; i < V; i += kArgmaxThreads) {
    if (best.at < 0 || logits[i] > best.v) best = Best{logits[i], i};
  }
  using Reduce = cub::BlockReduce<Best, kArgmaxThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  best = Reduce(tmp).Reduce(best, BestOf{});
  if (threadIdx.x == 0) *out = static_cast<int32_t>(best.at);
}

__global__ void keys_kernel(const float* logits, int64_t V, uint32_t* keys, int32_t* ids) {
  cuda::await_inputs();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < V) {
    keys[i] = order_key(logits[i]);
    ids[i] = static_cast<int32_t>(i);
  }
}

__global__ void __launch_bounds__(kThreads) block_sums_kernel(const uint32_t* keys, int64_t n0, float t, double* bsum) {
  cuda::await_inputs();
  __shared__ Shared sh;
  const double s = block_prefix(Weights(keys, t), blockIdx.x, n0, sh);
  if (threadIdx.x == kThreads - 1) bsum[blockIdx.x] = s;
}

// The candidates' running weight W(i) = bpre[b - 1] + block b's prefix at i (b = i / kThreads),
// non-decreasing in i, and the first index where it reaches a target. bpre: shared memory.
struct Prefix {
  Weights w;
  int64_t n0, nb;
  const double* bpre;
  Shared& sh;

  // The first thread (by index) for which `hit` holds, kThreads if none; every thread gets it.
  __device__ int64_t first_hit(bool hit) const {
    __shared__ int64_t first;
    const int64_t f = MinIndex(sh.reduce).Reduce(hit ? static_cast<int64_t>(threadIdx.x) : kThreads, ::cuda::minimum<>{});
    if (threadIdx.x == 0) first = f;
    __syncthreads();
    const int64_t r = first;
    __syncthreads();
    return r;
  }
  // The first i < n with W(i) >= target; n when there is none.
  __device__ int64_t crossing(double target, int64_t n) const {
    int64_t lo = 0, hi = nb;
    while (lo < hi) {  // the first block whose end reaches the target
      const int64_t mid = (lo + hi) / 2;
      if (bpre[mid] >= target) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    if (lo >= nb || lo * kThreads >= n) return n;  // the same for every thread
    const double at = (lo > 0 ? bpre[lo - 1] : 0.0) + block_prefix(w, lo, n0, sh);
    const int64_t i = lo * kThreads + threadIdx.x;
    const int64_t f = first_hit(i < n && at >= target);
    return f < kThreads ? lo * kThreads + f : n;
  }
  // W(i), i < n0.
  __device__ double running(int64_t i) const {
    const int64_t b = i / kThreads;
    const double at = (b > 0 ? bpre[b - 1] : 0.0) + block_prefix(w, b, n0, sh);
    __shared__ double value;
    if (static_cast<int64_t>(threadIdx.x) == i % kThreads) value = at;
    __syncthreads();
    const double r = value;
    __syncthreads();
    return r;
  }
  // The first i in [1, n) whose weight is below `floor` (weights fall along the order), n if
  // none: each round probes kThreads evenly spaced candidates at once.
  __device__ int64_t first_below(double floor, int64_t n) const {
    int64_t lo = 1, hi = n;  // the answer is in [lo, hi]
    while (lo < hi) {
      const int64_t step = (hi - lo + kThreads - 1) / kThreads;
      const int64_t q = lo + threadIdx.x * step;
      const int64_t f = first_hit(q < hi && w(q) < floor);
      const int64_t probes = (hi - lo + step - 1) / step;
      if (f == 0) return lo;
      const int64_t above = f < probes ? f : probes;  // probes 0 .. above - 1 are at or above
      hi = f < probes ? lo + f * step : hi;
      lo += (above - 1) * step + 1;
    }
    return lo;
  }
};

// One block: the block sums' running totals (in order, in shared memory, so that W's block
// ends are exactly them), then top-p, min-p and the draw (sample.h) on the first n0 sorted
// candidates, and the picked id.
__global__ void __launch_bounds__(kThreads)
    pick_kernel(const uint32_t* __restrict__ keys, const int32_t* __restrict__ ids, int64_t n0,
                const double* __restrict__ bsum, Params p, double u01, int32_t* __restrict__ out) {
  cuda::await_inputs();
  extern __shared__ double bpre[];  // [nb]
  __shared__ Shared sh;
  const int64_t nb = (n0 + kThreads - 1) / kThreads;
  for (int64_t b = threadIdx.x; b < nb; b += kThreads) bpre[b] = bsum[b];
  __syncthreads();
  if (threadIdx.x == 0) {
    double acc = 0;
    for (int64_t b = 0; b < nb; ++b) bpre[b] = (acc += bpre[b]);
  }
  __syncthreads();
  const Prefix W{Weights(keys, p.temperature), n0, nb, bpre, sh};
  int64_t n = n0;
  if (p.top_p < 1.0f) {
    const int64_t i = W.crossing(static_cast<double>(p.top_p) * bpre[nb - 1], n);
    if (i < n) n = i + 1;
  }
  if (p.min_p > 0.0f) n = W.first_below(static_cast<double>(p.min_p), n);  // the first weighs exp(0) = 1
  const int64_t i = W.crossing(u01 * W.running(n - 1), n);
  if (threadIdx.x == 0) *out = ids[i < n ? i : n - 1];
}

// A draw's log-probabilities on the device (DrawLogprobs), copied back in one piece.
struct LogprobStats {
  int32_t token;
  float chosen, lse;
  int32_t ids[DeviceSampler::kMaxTopLogprobs];
  float logits[DeviceSampler::kMaxTopLogprobs];
};

// The raw copy of the logits takes the edits' bans only (the penalties are the draw's).
__global__ void ban_kernel(float* raw, const Edit* edits, int n) {
  cuda::await_inputs();
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n && edits[i].banned != 0) raw[edits[i].id] = -INFINITY;
}

// One block: lse as the host computes it (the max, then exp(logit - max) in double summed in the
// block's tree order) and the top_n logits, pass k taking the largest below pass k - 1's pick
// in (logit descending, id ascending) order. NaN logits take no part.
__global__ void __launch_bounds__(kArgmaxThreads)
    logprob_stats_kernel(const float* raw, int64_t V, int top_n, LogprobStats* out) {
  cuda::await_inputs();
  using MaxOf = cub::BlockReduce<float, kArgmaxThreads>;
  using SumOf = cub::BlockReduce<double, kArgmaxThreads>;
  using BestIn = cub::BlockReduce<Best, kArgmaxThreads>;
  __shared__ union {
    typename MaxOf::TempStorage max;
    typename SumOf::TempStorage sum;
    typename BestIn::TempStorage best;
  } tmp;
  __shared__ float s_max;
  __shared__ Best s_pick;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += kArgmaxThreads) m = fmaxf(m, raw[i]);
  m = MaxOf(tmp.max).Reduce(m, ::cuda::maximum<>{});
  if (threadIdx.x == 0) s_max = m;
  __syncthreads();
  m = s_max;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < V; i += kArgmaxThreads) sum += exp(static_cast<double>(raw[i] - m));
  __syncthreads();
  sum = SumOf(tmp.sum).Sum(sum);
  if (threadIdx.x == 0) out->lse = m + static_cast<float>(log(sum));
  Best prev{INFINITY, -1};
  for (int k = 0; k < top_n; ++k) {
    Best best{0.0f, -1};
    for (int64_t i = threadIdx.x; i < V; i += kArgmaxThreads) {
      const float v = raw[i];
      const bool below = prev.at < 0 || v < prev.v || (v == prev.v && i > prev.at);
      if (below && !isnan(v) && (best.at < 0 || v > best.v)) best = Best{v, i};
    }
    __syncthreads();
    best = BestIn(tmp.best).Reduce(best, BestOf{});
    if (threadIdx.x == 0) s_pick = best;
    __syncthreads();
    prev = s_pick;
    if (threadIdx.x == 0) {
      out->ids[k] = static_cast<int32_t>(prev.at);
      out->logits[k] = prev.v;
    }
  }
}

// The drawn id and its logit in the raw copy.
__global__ void chosen_kernel(const float* raw, const int32_t* token, int64_t V, LogprobStats* out) {
  cuda::await_inputs();
  const int32_t t = *token;
  out->token = t;
  out->chosen = t >= 0 && t < V ? raw[t] : NAN;
}

class CudaSampler final : public DeviceSampler {
 public:
  CudaSampler(const ExecCtx& ctx, int64_t V) : ctx_(ctx), cap_(V) {}
  ~CudaSampler() override {
    for (void* p : {static_cast<void*>(keys_), static_cast<void*>(keys_sorted_), static_cast<void*>(ids_),
                    static_cast<void*>(ids_sorted_), static_cast<void*>(bsum_), temp_,
                    static_cast<void*>(edits_d_), static_cast<void*>(token_d_), static_cast<void*>(raw_),
                    static_cast<void*>(stats_d_)}) {
      if (p != nullptr) device_free(ctx_, p);
    }
    host_free_pinned(edits_h_);
    host_free_pinned(token_h_);
    host_free_pinned(stats_h_);
  }

  Status init() {
    const int64_t nb = (cap_ + kThreads - 1) / kThreads;
    CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairsDescending(nullptr, temp_bytes_, keys_, keys_sorted_, ids_,
                                                                    ids_sorted_, static_cast<int>(cap_), 0, 32,
                                                                    stream()));
    ASSIGN_OR_RETURN(keys_, alloc<uint32_t>(cap_));
    ASSIGN_OR_RETURN(keys_sorted_, alloc<uint32_t>(cap_));
    ASSIGN_OR_RETURN(ids_, alloc<int32_t>(cap_));
    ASSIGN_OR_RETURN(ids_sorted_, alloc<int32_t>(cap_));
    ASSIGN_OR_RETURN(bsum_, alloc<double>(nb));
    ASSIGN_OR_RETURN(temp_, device_alloc(ctx_, std::max<size_t>(temp_bytes_, 1)));
    ASSIGN_OR_RETURN(token_d_, alloc<int32_t>(1));
    ASSIGN_OR_RETURN(void* th, host_alloc_pinned(sizeof(int32_t)));
    token_h_ = static_cast<int32_t*>(th);
    ASSIGN_OR_RETURN(raw_, alloc<float>(cap_));
    ASSIGN_OR_RETURN(stats_d_, alloc<LogprobStats>(1));
    ASSIGN_OR_RETURN(void* sh, host_alloc_pinned(sizeof(LogprobStats)));
    stats_h_ = static_cast<LogprobStats*>(sh);
    return absl::OkStatus();
  }

  StatusOr<int32_t> draw(float* logits, int64_t V, const std::vector<Edit>& edits, const Penalties& pen,
                         const Params& p, double u01) override {
    RETURN_IF_ERROR(check(V, edits, p, u01));
    RETURN_IF_ERROR(apply(logits, edits, pen));
    RETURN_IF_ERROR(pick(logits, V, p, u01));
    RETURN_IF_ERROR(copy(ctx_, Copy::kDeviceToHost, token_h_, token_d_, sizeof(int32_t)));
    RETURN_IF_ERROR(stream_sync(ctx_));
    return checked(*token_h_, V);
  }

  StatusOr<int32_t> draw_logprobs(float* logits, int64_t V, const std::vector<Edit>& edits, const Penalties& pen,
                                  const Params& p, double u01, int top_n, DrawLogprobs* out) override {
    RETURN_IF_ERROR(check(V, edits, p, u01));
    if (top_n < 0 || top_n > kMaxTopLogprobs || top_n > V) {
      return absl::InvalidArgumentError(absl::StrCat("device sampler: ", top_n, " top log-probabilities (0 to ",
                                                     std::min<int64_t>(kMaxTopLogprobs, V), ")"));
    }
    const cudaStream_t st = stream();
    RETURN_IF_ERROR(copy(ctx_, Copy::kDeviceToDevice, raw_, logits, static_cast<size_t>(V) * sizeof(float)));
    RETURN_IF_ERROR(apply(logits, edits, pen));
    if (!edits.empty()) {
      const int n = static_cast<int>(edits.size());
      RETURN_IF_ERROR(cuda::launch(ban_kernel, cuda::LaunchParams{dim3((n + 255) / 256), dim3(256), 0, st}, raw_,
                                   edits_d_, n));
    }
    RETURN_IF_ERROR(cuda::launch(logprob_stats_kernel, cuda::LaunchParams{dim3(1), dim3(kArgmaxThreads), 0, st}, raw_,
                                 V, top_n, stats_d_));
    RETURN_IF_ERROR(pick(logits, V, p, u01));
    RETURN_IF_ERROR(
        cuda::launch(chosen_kernel, cuda::LaunchParams{dim3(1), dim3(1), 0, st}, raw_, token_d_, V, stats_d_));
    RETURN_IF_ERROR(copy(ctx_, Copy::kDeviceToHost, stats_h_, stats_d_, sizeof(LogprobStats)));
    RETURN_IF_ERROR(stream_sync(ctx_));
    const LogprobStats& r = *stats_h_;
    ASSIGN_OR_RETURN(const int32_t token, checked(r.token, V));
    out->chosen_logit = r.chosen;
    out->lse = r.lse;
    out->top_ids.assign(r.ids, r.ids + top_n);
    out->top_logits.assign(r.logits, r.logits + top_n);
    return token;
  }

 private:
  // Enqueues the pick of one id from the edited logits into token_d_.
  Status pick(const float* logits, int64_t V, const Params& p, double u01) {
    const cudaStream_t st = stream();
    const auto blocks = [](int64_t n) { return dim3(static_cast<unsigned>((n + kThreads - 1) / kThreads)); };
    if (p.temperature <= 0.0f) {
      RETURN_IF_ERROR(cuda::launch(argmax_kernel, cuda::LaunchParams{dim3(1), dim3(kArgmaxThreads), 0, st}, logits, V,
                                   token_d_));
    } else {
      const int64_t n0 = p.top_k > 0 ? std::min<int64_t>(V, p.top_k) : V;
      RETURN_IF_ERROR(cuda::launch(keys_kernel, cuda::LaunchParams{blocks(V), dim3(kThreads), 0, st}, logits, V, keys_,
                                   ids_));
      size_t bytes = temp_bytes_;
      CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairsDescending(temp_, bytes, keys_, keys_sorted_, ids_,
                                                                      ids_sorted_, static_cast<int>(V), 0, 32, st));
      RETURN_IF_ERROR(cuda::launch(block_sums_kernel, cuda::LaunchParams{blocks(n0), dim3(kThreads), 0, st},
                                   keys_sorted_, n0, p.temperature, bsum_));
      const size_t smem = static_cast<size_t>((n0 + kThreads - 1) / kThreads) * sizeof(double);
      RETURN_IF_ERROR(cuda::launch(pick_kernel, cuda::LaunchParams{dim3(1), dim3(kThreads), smem, st}, keys_sorted_,
                                   ids_sorted_, n0, bsum_, p, u01, token_d_));
    }
    return absl::OkStatus();
  }

  static StatusOr<int32_t> checked(int32_t token, int64_t V) {
    if (token < 0 || token >= V) {
      return absl::InternalError(absl::StrCat("device sampler: picked id ", token, " outside the vocabulary"));
    }
    return token;
  }

  cudaStream_t stream() const { return cuda::stream_of(ctx_); }
  template <typename T>
  StatusOr<T*> alloc(int64_t n) {
    ASSIGN_OR_RETURN(void* p, device_alloc(ctx_, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T)));
    return static_cast<T*>(p);
  }

  Status check(int64_t V, const std::vector<Edit>& edits, const Params& p, double u01) const {
    if (V <= 0 || V > cap_) {
      return absl::InvalidArgumentError(absl::StrCat("device sampler: ", V, " ids (made for up to ", cap_, ")"));
    }
    for (size_t k = 0; k < edits.size(); ++k) {
      if (edits[k].id < 0 || edits[k].id >= V || (k > 0 && edits[k].id <= edits[k - 1].id)) {
        return absl::InvalidArgumentError(absl::StrCat("device sampler: edit ", k, " (id ", edits[k].id,
                                                       ") is outside the vocabulary or out of ascending order"));
      }
    }
    if (!(p.temperature >= 0.0f) || !(p.top_p > 0.0f && p.top_p <= 1.0f) || !(p.min_p >= 0.0f && p.min_p <= 1.0f) ||
        p.top_k < 0 || !(u01 >= 0.0 && u01 < 1.0)) {
      return absl::InvalidArgumentError("device sampler: parameters out of range");
    }
    return absl::OkStatus();
  }

  // Stages the edits through pinned memory (the previous draw has synchronised) and runs them.
  Status apply(float* logits, const std::vector<Edit>& edits, const Penalties& pen) {
    if (edits.empty()) return absl::OkStatus();
    if (edits.size() > edits_cap_) {
      host_free_pinned(edits_h_);
      edits_h_ = nullptr;
      if (edits_d_ != nullptr) device_free(ctx_, edits_d_);
      edits_d_ = nullptr;
      edits_cap_ = std::max<size_t>(edits.size(), 2 * edits_cap_);
      ASSIGN_OR_RETURN(void* h, host_alloc_pinned(edits_cap_ * sizeof(Edit)));
      edits_h_ = static_cast<Edit*>(h);
      ASSIGN_OR_RETURN(edits_d_, alloc<Edit>(static_cast<int64_t>(edits_cap_)));
    }
    std::copy(edits.begin(), edits.end(), edits_h_);
    RETURN_IF_ERROR(copy(ctx_, Copy::kHostToDevice, edits_d_, edits_h_, edits.size() * sizeof(Edit)));
    const int n = static_cast<int>(edits.size());
    return cuda::launch(edit_kernel, cuda::LaunchParams{dim3((n + 255) / 256), dim3(256), 0, stream()}, logits,
                        edits_d_, n, pen);
  }

  ExecCtx ctx_;
  int64_t cap_;
  uint32_t *keys_ = nullptr, *keys_sorted_ = nullptr;
  int32_t *ids_ = nullptr, *ids_sorted_ = nullptr;
  double* bsum_ = nullptr;
  void* temp_ = nullptr;
  size_t temp_bytes_ = 0;
  Edit* edits_h_ = nullptr;
  Edit* edits_d_ = nullptr;
  size_t edits_cap_ = 0;
  int32_t* token_d_ = nullptr;
  int32_t* token_h_ = nullptr;
  float* raw_ = nullptr;  // draw_logprobs: the logits before the draw's edits
  LogprobStats* stats_d_ = nullptr;
  LogprobStats* stats_h_ = nullptr;
};

}  // namespace

StatusOr<std::unique_ptr<DeviceSampler>> DeviceSampler::create(const ExecCtx& ctx, int64_t V) {
  if (V <= 0 || V > kMaxVocab) {
    return absl::InvalidArgumentError(absl::StrCat("device sampler: ", V, " ids (at most ", kMaxVocab, ")"));
  }
  auto s = std::make_unique<CudaSampler>(ctx, V);
  RETURN_IF_ERROR(s->init());
  return std::unique_ptr<DeviceSampler>(std::move(s));
}

}  // namespace dsflash::kernels::sample
