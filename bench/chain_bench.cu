// What a decode layer's chain costs as separate kernels against one persistent kernel (issue 6,
// docs/cuda-backend.md Next 2). A layer is modelled as the perf preset's chain: its weight
// GEMVs at their real byte sizes (q_a, wq_b, wo_a, wo_b, six experts' gate/up and down; int8
// weights, dp4a against an int8 x formed from the previous GEMV's output) and, between them,
// phases of fixed work that read no weights (hc, q_norm, attention, router and route, SwiGLU,
// combine: every CTA spins a set time, scaled by --spin-scale). Each form runs `--layers`
// layers with their own weights (well beyond L2) and computes the same outputs, compared word
// for word:
//   kernels   one kernel a phase (a warp a row, 16-byte loads), programmatic dependent launch,
//             one CUDA graph (dsflash's form); kernels_nopdl the same without PDL
//   pK        one cooperative kernel, a CTA a SM, the phases separated by grid barriers; a
//             producer warp streams the CTA's rows of every GEMV through a ring of 12 x 16 KB
//             shared-memory stages by bulk copies, 16 consumer warps multiply them, and a GEMV's
//             copies may start K phases before the phase itself: p0 (at its own start, before
//             its barrier), p1 (one phase before), pall (any time: the ring runs ahead as far as
//             it holds). The experts' weights are never copied before the layer's first expert
//             phase starts (routing picks them).
// Diagnostic forms (outputs not compared): the persistent kernel's ring without barriers
// (ring_only; ring_nocompute: nothing multiplied) and its barriers without weights
// (barriers_only). Then each GEMV kernel alone, in a chain of its own kind.
// Reports each form's time a layer and the bytes-bound fraction (weight bytes over a plain
// read of the same bytes at the measured streaming rate).
//   chain_bench [--layers N] [--reps N] [--spin-scale F] [--csv FILE] [--label TEXT]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_csv.h"
#include "bench/bench_cuda.cuh"

namespace {

using bench::delay_kernel;
using bench::median;

constexpr int kMaxPhases = 16;
constexpr int kThreads = 256;    // the kernels form's CTAs
constexpr int kConsumers = 512;  // the persistent kernel's consumer threads (a producer warp more)
constexpr int kStages = 12;
constexpr int kChunk = 16384;   // bytes a ring stage (whole rows)
constexpr int kMaxRb = 4608;    // longest row, bytes

struct Phase {
  int rows = 0, rb = 0;    // a GEMV: rows x rb int8 weights (rb a multiple of 16); rows 0: fixed work
  int spin_ns = 0;         // fixed work: every CTA spins this long
  bool routed = false;     // weights chosen by routing: not copied before the phase starts
};

struct Chain {
  Phase ph[kMaxPhases];
  int n = 0, layers = 0;
  const int8_t* w[kMaxPhases];  // a phase's weights, layer l at w + l * rows * rb
  int32_t* y[kMaxPhases];       // a phase's outputs, layer l at y + l * rows
  const int32_t* y_in;          // the first GEMV's input (layer 0)
  int in_rows;
};

// The GEMV before phase p (layer l): its outputs form p's x. Layer 0's first: the chain's input.
__host__ __device__ inline void input_of(const Chain& c, int l, int p, const int32_t** y, int* rows) {
  for (int q = p - 1; q >= 0; --q) {
    if (c.ph[q].rows > 0) {
      *y = c.y[q] + static_cast<size_t>(l) * c.ph[q].rows;
      *rows = c.ph[q].rows;
      return;
    }
  }
  if (l == 0) {
    *y = c.y_in;
    *rows = c.in_rows;
    return;
  }
  for (int q = c.n - 1; q >= 0; --q) {
    if (c.ph[q].rows > 0) {
      *y = c.y[q] + static_cast<size_t>(l - 1) * c.ph[q].rows;
      *rows = c.ph[q].rows;
      return;
    }
  }
}

// x[j] from the previous outputs (L2 loads: they were written by other CTAs this launch).
__device__ void form_x(int8_t* xs, int rb, const int32_t* y, int rows) {
  for (int j = threadIdx.x; j < rb; j += blockDim.x) {
    xs[j] = static_cast<int8_t>((__ldcg(y + j % rows) >> 5) ^ j);
  }
  __syncthreads();
}

__device__ inline int dot16(uint4 w, uint4 x) {
  int s = __dp4a(static_cast<int>(w.x), static_cast<int>(x.x), 0);
  s = __dp4a(static_cast<int>(w.y), static_cast<int>(x.y), s);
  s = __dp4a(static_cast<int>(w.z), static_cast<int>(x.z), s);
  return __dp4a(static_cast<int>(w.w), static_cast<int>(x.w), s);
}

__device__ inline void spin(int ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < static_cast<unsigned long long>(ns));
}

__device__ inline void await_inputs() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// ---- Form "kernels": one kernel a phase ----

__global__ void __launch_bounds__(kThreads) gemv_kernel(Chain c, int l, int p) {
  __shared__ __align__(16) int8_t xs[kMaxRb];
  const Phase ph = c.ph[p];
  const int8_t* w = c.w[p] + static_cast<size_t>(l) * ph.rows * ph.rb;
  int32_t* y = c.y[p] + static_cast<size_t>(l) * ph.rows;
  const int32_t* yp;
  int prows;
  input_of(c, l, p, &yp, &prows);
  await_inputs();
  form_x(xs, ph.rb, yp, prows);
  const int warps = blockDim.x / 32, lane = threadIdx.x % 32;
  for (int row = blockIdx.x * warps + threadIdx.x / 32; row < ph.rows; row += gridDim.x * warps) {
    const int8_t* wr = w + static_cast<size_t>(row) * ph.rb;
    int s = 0;
#pragma unroll 3
    for (int off = lane * 16; off < ph.rb; off += 512) {
      s += dot16(__ldg(reinterpret_cast<const uint4*>(wr + off)), *reinterpret_cast<const uint4*>(xs + off));
    }
#pragma unroll
    for (int d = 16; d > 0; d /= 2) s += __shfl_xor_sync(0xffffffffu, s, d);
    if (lane == 0) y[row] = s;
  }
}

__global__ void spin_kernel(int ns) {
  await_inputs();
  spin(ns);
}

// ---- Form "pK": one persistent kernel ----

__device__ inline unsigned smem_addr(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

__device__ inline void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

__device__ inline void bar_wait(uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n .reg .pred done;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n @!done bra "
      "WAIT_%=;\n}" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// The consumer warps' own CTA barrier (named barrier 1; the producer warp never joins it).
__device__ inline void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"r"(kConsumers) : "memory"); }

// All CTAs of the launch (co-resident: a cooperative launch) meet; generation-counted, so it
// resets itself. Thread 0 arrives with a release and polls with acquires.
__device__ void grid_barrier(unsigned* count, unsigned* gen) {
  consumers_sync();
  if (threadIdx.x == 0) {
    unsigned g;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(g) : "l"(gen) : "memory");
    unsigned arrived;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(arrived) : "l"(count) : "memory");
    if (arrived == gridDim.x - 1) {
      asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(count) : "memory");
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(gen) : "memory");
    } else {
      unsigned now;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(gen) : "memory");
      } while (now == g);
    }
  }
  consumers_sync();
}

// A CTA's next chunk of weights in stream order: (layer, phase, first row, rows).
struct Cursor {
  int l = 0, p = -1, row = 0, n = 0, end = 0, per_chunk = 0;
};

__device__ void slab(const Chain& c, int p, int* r0, int* r1) {
  *r0 = static_cast<int>(static_cast<long long>(c.ph[p].rows) * blockIdx.x / gridDim.x);
  *r1 = static_cast<int>(static_cast<long long>(c.ph[p].rows) * (blockIdx.x + 1) / gridDim.x);
}

// Moves to the next chunk: the rest of this slab, else the next GEMV phase's slab with rows.
__device__ void advance(const Chain& c, Cursor& k) {
  k.row += k.n;
  while (k.row >= k.end) {
    if (++k.p == c.n) {
      k.p = 0;
      if (++k.l == c.layers) {
        k.n = 0;
        return;
      }
    }
    if (c.ph[k.p].rows == 0) continue;
    slab(c, k.p, &k.row, &k.end);
    k.per_chunk = kChunk / c.ph[k.p].rb;
  }
  k.n = min(k.end - k.row, k.per_chunk);
}

// The earliest phase (global index l * n + p) at which a chunk of phase p may be copied: K
// phases before its own (lookahead K; -1: any time), and a routed phase's not before its layer's
// first routed phase (routing is known from there).
__device__ int issue_gate(const Chain& c, const Cursor& k, int lookahead) {
  const int gp = k.l * c.n + k.p;
  int gate = lookahead < 0 ? 0 : gp - lookahead;
  if (c.ph[k.p].routed) {
    int first = 0;
    while (!c.ph[first].routed) ++first;
    gate = max(gate, k.l * c.n + first);
  }
  return gate;
}

// Diagnostic forms (their outputs are not the chain's): kRingOnly streams and multiplies every
// chunk with no barriers and no x formed (with kNoCompute: only streams); kBarriersOnly meets at
// the barriers and spins, no weights.
constexpr int kRingOnly = 1, kBarriersOnly = 2, kNoCompute = 4;

// kConsumers consumer threads (16 warps: a warp a row of each chunk) and one producer warp whose
// lane 0 copies the CTA's chunks in stream order into the ring: stage s is free again once
// every consumer warp has arrived on empty[s], full once its bytes have landed.
__device__ void produce(const Chain& c, int lookahead, uint8_t* ring, uint64_t* full, uint64_t* empty,
                        volatile int* cur) {
  Cursor k;
  advance(c, k);
  for (unsigned i = 0; k.n > 0; ++i) {
    const int gate = issue_gate(c, k, lookahead);
    while (*cur < gate) {
    }
    const unsigned s = i % kStages;
    if (i >= kStages) bar_wait(&empty[s], ((i / kStages) - 1) & 1);
    const Phase& ph = c.ph[k.p];
    const int8_t* src = c.w[k.p] + (static_cast<size_t>(k.l) * ph.rows + k.row) * ph.rb;
    bulk_copy(ring + s * kChunk, src, static_cast<unsigned>(k.n * ph.rb), &full[s]);
    advance(c, k);
  }
}

__global__ void __launch_bounds__(kConsumers + 32, 1) persistent_kernel(Chain c, int lookahead, int flags,
                                                                       unsigned* count, unsigned* gen) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* ring = smem;
  int8_t* xs = reinterpret_cast<int8_t*>(smem + kStages * kChunk);
  __shared__ __align__(8) uint64_t full[kStages], empty[kStages];
  __shared__ int cur;  // the phase (global index l * n + p) the consumers are in
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&full[s])));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(&empty[s])), "r"(kConsumers / 32));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    cur = 0;
  }
  __syncthreads();
  if (threadIdx.x >= kConsumers) {
    if (threadIdx.x == kConsumers && !(flags & kBarriersOnly)) produce(c, lookahead, ring, full, empty, &cur);
    return;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  Cursor k;
  advance(c, k);
  unsigned used = 0;  // chunks consumed
  for (int l = 0; l < c.layers; ++l) {
    for (int p = 0; p < c.n; ++p) {
      if (threadIdx.x == 0) *static_cast<volatile int*>(&cur) = l * c.n + p;
      if (l + p > 0 && !(flags & kRingOnly)) grid_barrier(count, gen);
      const Phase& ph = c.ph[p];
      if (ph.rows == 0 || (flags & kBarriersOnly)) {
        spin(ph.spin_ns);
        continue;
      }
      const int32_t* yp;
      int prows;
      input_of(c, l, p, &yp, &prows);
      if (!(flags & kRingOnly)) {
        for (int j = threadIdx.x; j < ph.rb; j += kConsumers) xs[j] = static_cast<int8_t>((__ldcg(yp + j % prows) >> 5) ^ j);
        consumers_sync();
      }
      int32_t* y = c.y[p] + static_cast<size_t>(l) * ph.rows;
      const int words = ph.rb / 16;
      for (; k.n > 0 && k.l == l && k.p == p; ++used, advance(c, k)) {
        const unsigned s = used % kStages;
        bar_wait(&full[s], (used / kStages) & 1);
        const uint4* chunk = reinterpret_cast<const uint4*>(ring + s * kChunk);
        for (int r = warp; r < k.n && !(flags & kNoCompute); r += kConsumers / 32) {  // a warp a row
          int acc = 0;
          for (int j = lane; j < words; j += 32) acc += dot16(chunk[r * words + j], reinterpret_cast<const uint4*>(xs)[j]);
#pragma unroll
          for (int d = 16; d > 0; d /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, d);
          if (lane == 0) y[k.row + r] = acc;
        }
        __syncwarp();
        if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(&empty[s])) : "memory");
      }
      consumers_sync();  // x is rewritten at the next phase
    }
  }
}

// ---- A plain read of the same bytes: the streaming rate the bound is taken at ----

__global__ void read_kernel(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

__global__ void fill_kernel(uint32_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9e3779b1u ^ seed;
    h ^= h >> 15;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    p[i] = h;
  }
}


// The perf preset's layer (docs/cuda-backend.md "Where a step goes"): GEMV bytes as Q4_K (dense)
// and Q2_K / Q3_K (experts) rows; fixed work between them scaled by `spin_scale`.
std::vector<Phase> layer_phases(double spin_scale) {
  auto work = [&](int ns) { Phase p; p.spin_ns = static_cast<int>(ns * spin_scale); return p; };
  auto gemv = [](int rows, int rb, bool routed) { Phase p; p.rows = rows; p.rb = rb; p.routed = routed; return p; };
  return {work(2000),                  // hc post + pre + norm
          gemv(1280, 2880, false),     // wq_a: 5120 -> 1280
          work(500),                   // q_norm
          gemv(32768, 720, false),     // wq_b: 1280 -> 64 x 512
          work(8000),                  // sparse attention
          gemv(8192, 2304, false),     // wo_a: 8 groups of 4096 -> 1024
          gemv(5120, 4608, false),     // wo_b: 8192 -> 5120
          work(2000),                  // hc
          work(2000),                  // router and route
          gemv(27648, 1680, true),     // six experts' gate and up: 5120 -> 2 x 2304, Q2_K
          work(500),                   // SwiGLU
          gemv(30720, 992, true),      // six experts' down: 2304 -> 5120, Q3_K (990 bytes, 992)
          work(500)};                  // combine
}

struct Setup {
  Chain c;
  std::vector<size_t> y_words;  // per phase, all layers
  int sms = 0;
  size_t weight_bytes = 0;
};

class Timer {
 public:
  Timer() {
    CHECK(cudaEventCreate(&a_));
    CHECK(cudaEventCreate(&b_));
  }
  template <typename F>
  float run(F&& launch) {
    delay_kernel<<<1, 1>>>(40000);  // the timed work queued before its start event fires
    CHECK(cudaEventRecord(a_));
    launch();
    CHECK(cudaEventRecord(b_));
    CHECK(cudaEventSynchronize(b_));
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, a_, b_));
    return ms * 1000.0f;
  }

 private:
  cudaEvent_t a_, b_;
};

// The chain as kernels in one graph; only >= 0: phase `only` alone, once a layer (its time in a
// chain of its own kind; its inputs then are not the chain's).
cudaGraphExec_t capture_kernels(const Setup& s, bool pdl, int only = -1) {
  cudaStream_t st;
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int occ = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, gemv_kernel, kThreads, 0));
  CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  for (int l = 0; l < s.c.layers; ++l) {
    for (int p = 0; p < s.c.n; ++p) {
      if (only >= 0 && p != only) continue;
      const Phase& ph = s.c.ph[p];
      cudaLaunchConfig_t cfg{};
      cfg.stream = st;
      cfg.attrs = &attr;
      cfg.numAttrs = pdl ? 1 : 0;
      if (ph.rows > 0) {
        cfg.gridDim = dim3(std::min((ph.rows + kThreads / 32 - 1) / (kThreads / 32), s.sms * occ));
        cfg.blockDim = dim3(kThreads);
        CHECK(cudaLaunchKernelEx(&cfg, gemv_kernel, s.c, l, p));
      } else {
        cfg.gridDim = dim3(s.sms);
        cfg.blockDim = dim3(32);
        CHECK(cudaLaunchKernelEx(&cfg, spin_kernel, ph.spin_ns));
      }
    }
  }
  cudaGraph_t g;
  CHECK(cudaStreamEndCapture(st, &g));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, g, 0));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaStreamDestroy(st));
  return exec;
}

constexpr size_t kDynSmem = kStages * kChunk + kMaxRb;

void launch_persistent(const Setup& s, int lookahead, unsigned* sync, int flags = 0) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeCooperative;
  attr.val.cooperative = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(s.sms);
  cfg.blockDim = dim3(kConsumers + 32);
  cfg.dynamicSmemBytes = kDynSmem;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  CHECK(cudaLaunchKernelEx(&cfg, persistent_kernel, s.c, lookahead, flags, sync, sync + 1));
}

std::vector<int32_t> outputs(const Setup& s) {
  std::vector<int32_t> all;
  for (int p = 0; p < s.c.n; ++p) {
    if (s.y_words[p] == 0) continue;
    std::vector<int32_t> h(s.y_words[p]);
    CHECK(cudaMemcpy(h.data(), s.c.y[p], h.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
    all.insert(all.end(), h.begin(), h.end());
  }
  return all;
}

void poison(const Setup& s) {
  for (int p = 0; p < s.c.n; ++p) {
    if (s.y_words[p] > 0) CHECK(cudaMemset(s.c.y[p], 0xff, s.y_words[p] * sizeof(int32_t)));
  }
  CHECK(cudaDeviceSynchronize());
}

Setup make_setup(int layers, double spin_scale) {
  Setup s;
  CHECK(cudaDeviceGetAttribute(&s.sms, cudaDevAttrMultiProcessorCount, 0));
  const std::vector<Phase> phases = layer_phases(spin_scale);
  s.c.n = static_cast<int>(phases.size());
  s.c.layers = layers;
  s.y_words.assign(s.c.n, 0);
  for (int p = 0; p < s.c.n; ++p) {
    s.c.ph[p] = phases[p];
    s.c.w[p] = nullptr;
    s.c.y[p] = nullptr;
    if (phases[p].rows == 0) continue;
    const size_t bytes = static_cast<size_t>(layers) * phases[p].rows * phases[p].rb;
    void* w = nullptr;
    CHECK(cudaMalloc(&w, bytes));
    fill_kernel<<<1024, 256>>>(static_cast<uint32_t*>(w), bytes / 4, 0x1234u + p);
    s.c.w[p] = static_cast<const int8_t*>(w);
    s.weight_bytes += bytes;
    s.y_words[p] = static_cast<size_t>(layers) * phases[p].rows;
    CHECK(cudaMalloc(&s.c.y[p], s.y_words[p] * sizeof(int32_t)));
  }
  s.c.in_rows = 4096;
  int32_t* in = nullptr;
  CHECK(cudaMalloc(&in, s.c.in_rows * sizeof(int32_t)));
  fill_kernel<<<16, 256>>>(reinterpret_cast<uint32_t*>(in), s.c.in_rows, 0x77u);
  s.c.y_in = in;
  CHECK(cudaDeviceSynchronize());
  return s;
}

// A plain streaming read of one buffer as large as all the weights (the bound's rate).
float read_us(const Setup& s, Timer& t, int reps) {
  void* buf = nullptr;
  CHECK(cudaMalloc(&buf, s.weight_bytes));
  fill_kernel<<<1024, 256>>>(static_cast<uint32_t*>(buf), s.weight_bytes / 4, 5u);
  unsigned* sink = nullptr;
  CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  std::vector<float> v;
  for (int r = 0; r < reps + 1; ++r) {
    const float us = t.run([&] { read_kernel<<<s.sms * 8, 256>>>(static_cast<const uint4*>(buf), s.weight_bytes / 16, sink); });
    if (r > 0) v.push_back(us);
  }
  CHECK(cudaFree(buf));
  CHECK(cudaFree(sink));
  return median(v);
}

struct Args {
  int layers = 8, reps = 9;
  double spin_scale = 1.0;
  std::string csv, label = "perf preset layer chain, int8 rows of the Q-types' bytes";
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const bool more = i + 1 < argc;
    if (!std::strcmp(argv[i], "--layers") && more) {
      a.layers = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--reps") && more) {
      a.reps = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--spin-scale") && more) {
      a.spin_scale = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--csv") && more) {
      a.csv = argv[++i];
    } else if (!std::strcmp(argv[i], "--label") && more) {
      a.label = argv[++i];
    } else {
      std::fprintf(stderr, "usage: chain_bench [--layers N] [--reps N] [--spin-scale F] [--csv FILE] [--label TEXT]\n");
      std::exit(2);
    }
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  CHECK(cudaFuncSetAttribute(persistent_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kDynSmem)));
  const Setup s = make_setup(a.layers, a.spin_scale);
  unsigned* sync = nullptr;
  CHECK(cudaMalloc(&sync, 2 * sizeof(unsigned)));
  CHECK(cudaMemset(sync, 0, 2 * sizeof(unsigned)));
  Timer t;
  const float read = read_us(s, t, a.reps);
  int fixed_ns = 0;
  for (int p = 0; p < s.c.n; ++p) fixed_ns += s.c.ph[p].spin_ns;
  std::printf("%d layers, %.1f MB of weights a layer, plain read %.1f us a layer (%.2f TB/s), fixed work %.1f us a layer\n",
              a.layers, s.weight_bytes / 1e6 / a.layers, read / a.layers, s.weight_bytes / read / 1e6, fixed_ns / 1e3);
  const cudaGraphExec_t pdl = capture_kernels(s, true), plain = capture_kernels(s, false);
  struct Form {
    const char* name;
    std::function<void()> launch;
    bool diagnostic = false;  // outputs not the chain's: not compared
  };
  const std::vector<Form> forms = {
      {"kernels", [&] { CHECK(cudaGraphLaunch(pdl, 0)); }},
      {"kernels_nopdl", [&] { CHECK(cudaGraphLaunch(plain, 0)); }},
      {"p0", [&] { launch_persistent(s, 0, sync); }},
      {"p1", [&] { launch_persistent(s, 1, sync); }},
      {"pall", [&] { launch_persistent(s, -1, sync); }},
      {"ring_only", [&] { launch_persistent(s, -1, sync, kRingOnly); }, true},
      {"ring_nocompute", [&] { launch_persistent(s, -1, sync, kRingOnly | kNoCompute); }, true},
      {"barriers_only", [&] { launch_persistent(s, -1, sync, kBarriersOnly); }, true}};
  CsvRows rows(a.csv, "chain_bench", prop.name);
  const std::string config = a.label + ", " + std::to_string(a.layers) + " layers, fixed work " +
                             std::to_string(fixed_ns / 1000.0).substr(0, 4) + " us a layer, " + std::to_string(s.sms) + " SMs";
  std::vector<int32_t> ref;
  int failures = 0;
  std::printf("%-14s %12s %12s %10s\n", "form", "us_a_layer", "excess_us", "of_bound");
  for (const Form& f : forms) {
    poison(s);
    f.launch();
    CHECK(cudaDeviceSynchronize());
    const std::vector<int32_t> out = outputs(s);
    if (!f.diagnostic && ref.empty()) {
      ref = out;
    } else if (!f.diagnostic && out != ref) {
      std::fprintf(stderr, "chain_bench: %s's outputs differ from %s's\n", f.name, forms[0].name);
      ++failures;
    }
    std::vector<float> v;
    for (int r = 0; r < a.reps; ++r) v.push_back(t.run(f.launch));
    const float us = median(v) / a.layers;
    std::printf("%-14s %12.2f %12.2f %10.3f\n", f.name, us, us - (read + fixed_ns / 1e3 * a.layers) / a.layers,
                read / a.layers / us);
    rows.add(config + ", form " + f.name, "us_a_layer", us, "us");
    rows.add(config + ", form " + f.name, "fraction_of_read_bound", read / a.layers / us, "ratio");
  }
  rows.add(config, "plain_read_us_a_layer", read / a.layers, "us");
  std::printf("each GEMV kernel alone, in a chain of its own kind (PDL graph):\n");
  for (int p = 0; p < s.c.n; ++p) {
    if (s.c.ph[p].rows == 0) continue;
    const cudaGraphExec_t g = capture_kernels(s, true, p);
    std::vector<float> v;
    for (int r = 0; r < a.reps; ++r) v.push_back(t.run([&] { CHECK(cudaGraphLaunch(g, 0)); }));
    const float us = median(v) / a.layers;
    const double mb = static_cast<double>(s.c.ph[p].rows) * s.c.ph[p].rb / 1e6;
    std::printf("  phase %2d: %6d x %4d (%5.1f MB) %7.2f us (%.2f TB/s)\n", p, s.c.ph[p].rows, s.c.ph[p].rb, mb, us,
                mb / us);
    rows.add(config + ", kernel of phase " + std::to_string(p) + " alone (" + std::to_string(s.c.ph[p].rows) + " x " +
                 std::to_string(s.c.ph[p].rb) + " bytes)",
             "us_a_kernel", us, "us");
    CHECK(cudaGraphExecDestroy(g));
  }
  return failures == 0 ? 0 : 1;
}
