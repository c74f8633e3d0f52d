// Sparse attention on the tensor cores (docs/cuda-backend.md, Next item 5), for a decode row and
// for the rows of a prefill chunk alike (each row on its own clusters): all heads share each KV
// row (one KV head, V = K), so a chunk of 64 list entries is two small GEMMs, logits = Q K^T
// and the chunk's value sum P V, on bf16 m16n8k16 with fp32 sums. Every operand is a bf16 value (q after wq_b and the RoPE's rounding, the rows after their QDQ, p
// rounded as the reference does), so each product is exact and only the order of the fp32 sums
// differs from the split kernels' (sparse_split.cu): the value sums' within a chunk too.
//
// One cluster of kHeadsTc heads: a CTA per chunk (up to 16 where the device grants clusters of
// 16, a non-portable size: the H200 does), else two a CTA past 8 chunks (at most 16). Each CTA
// gathers its chunks' rows into shared memory as bf16, takes the logits of its heads, exchanges
// its chunks' maxima over distributed shared memory for the running max of the chunks up to each
// (the reference's chunk loop), forms p, their entry-order sum and bf16 p, and its value sums
// (the first of two chunks' rows gathered again); the cluster then merges the chunks in order
// (acc = acc * rescale + part, L likewise), adds the sink, divides and inverse-rotates, each CTA a
// share of the heads.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/attn/attn_args.cuh"
#include "kernels/attn/sparse_tc.cuh"
#include "kernels/cuda/cuda_util.cuh"

namespace dsflash::kernels::attn::detail {
namespace {

namespace cg = cooperative_groups;

constexpr int kChunkTc = 64;          // list entries a CTA takes (the reference's chunk)
constexpr int kHeadsTc = 16;          // heads a CTA takes: one m16 tile
constexpr int kWarpsTc = 8;           // logits: a warp per 8 entries; values: a warp per Dh / 8 dims
constexpr int kThreadsTc = kWarpsTc * 32;
constexpr int kMaxCluster = 8;        // CTAs a cluster: a portable one
constexpr int kWideCluster = 16;      // and a non-portable one, where the device grants it
constexpr int kChunksCta = 2;         // chunks a CTA takes at most (lists of up to 16 chunks)
constexpr int kMaxChunks = kMaxCluster * kChunksCta;
static_assert(kWideCluster == kMaxChunks, "a wide cluster takes a chunk a CTA");
constexpr int kRopeTc = kChunkTc;     // RoPE dims it takes: a head's fit a logit row
constexpr int64_t kMaxRowsTc = 65535;  // query rows a launch takes (the grid's z)
// Head dims it takes: the model's 512 and the golden model's 64 (a warp's share of the value sums
// is whole n8 tiles).
constexpr bool head_dim_tc(int64_t Dh) { return Dh == 512 || Dh == 64; }
template <int Dh>
constexpr int kPitch = Dh + 8;  // bf16 a row in shared memory (Dh 512: 1,040 bytes, rows 4 banks apart)
constexpr int kPPitch = kChunkTc + 8;

// Shared memory of a CTA (dynamic, ~98 KB: sm_121 has 99): q of its heads and a chunk's rows as
// bf16, its chunks' logits, bf16 p, maxima and sums; the rows' space holds the chunks' value sums
// last (for the merge).
template <int Dh>
struct TcSmem {
  __nv_bfloat16 q[kHeadsTc][kPitch<Dh>];
  __nv_bfloat16 kv[kChunkTc][kPitch<Dh>];  // then float part[kChunksCta][kHeadsTc][Dh]
  float logit[kChunksCta][kHeadsTc][kChunkTc];
  __nv_bfloat16 p[kHeadsTc][kPPitch];
  float cmax[kChunksCta][kHeadsTc];
  float psum[kChunksCta][kHeadsTc];
  const float* rows[kChunkTc];
  float cmax_all[kMaxChunks][kHeadsTc];  // every chunk's maxima (copied over the cluster)
  float psum_all[kMaxChunks][kHeadsTc];  // and sums
  float m_run[kChunksCta][kHeadsTc];     // the running max through each of this CTA's chunks
  float resc[kHeadsTc][kMaxChunks];      // the merge's rescale of each chunk's part
  float L[kHeadsTc];                     // and the softmax's denominator
  const float* part_of[kMaxChunks];      // each chunk's value sums (distributed shared memory)
};
static_assert(sizeof(__nv_bfloat16) * kChunkTc * kPitch<512> >= sizeof(float) * kChunksCta * kHeadsTc * 512,
              "the parts fit the rows");
static_assert(sizeof(__nv_bfloat16) * kChunkTc * kPitch<64> >= sizeof(float) * kChunksCta * kHeadsTc * 64,
              "the parts fit the rows");

// Chunk q of the list: CTA q / per of the cluster, its slot q % per.
struct ChunkMap {
  int chunks, per;
  __host__ __device__ int ctas() const { return (chunks + per - 1) / per; }  // the cluster's size
};

// A list of width entries: chunks of 64, one a CTA up to `cluster` (8 or 16), then two.
__host__ __device__ inline ChunkMap chunk_map(int64_t width, int cluster) {
  const int chunks = static_cast<int>((width + kChunkTc - 1) / kChunkTc);
  return ChunkMap{chunks, (chunks + cluster - 1) / cluster};
}

struct TcArgs {
  const float* q;  // [S][H][Dh], before RoPE
  int64_t S;       // query rows (row t at position pos0 + t)
  int H;
  const float* kv_a;
  int64_t n_a;
  const float* kv_b;
  const int32_t* idx;  // [S][width - win.ww]
  int64_t width;
  const float* sink;
  float scale;
  RopeArgs rope;
  WindowArgs win;
  float* o;  // [S][H][Dh]
  int cluster;  // the most CTAs a cluster: kMaxCluster or kWideCluster
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ uint32_t word_of(const __nv_bfloat16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// d += A B (m16n8k16, bf16 in, fp32 sums): A rows g, g + 8 and B column g as mma_common.cuh.
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// B of m16n8k16 from a row-major [k][n] bf16 tile (rows 16 bytes aligned): lanes 0..15 give rows
// k0 .. k0 + 15 at column n0.
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t& b0, uint32_t& b1, const __nv_bfloat16* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
               : "=r"(b0), "=r"(b1)
               : "r"(smem_addr(row)));
}

// q of row t's heads h0 .. h0 + 15 as bf16 (exact: wq_b's values); then its RoPE dims, read
// again and rotated at position pos0 + t (rotate_pair rounds them to bf16) in a rolled loop:
// sincosf is long, and this code runs once a CTA (every instruction of it an instruction-cache
// miss).
template <int Dh>
__device__ __forceinline__ void load_q(const TcArgs& a, int64_t t, int h0, TcSmem<Dh>& s) {
  const float* q_row = a.q + t * a.H * Dh;
  const float4* src = reinterpret_cast<const float4*>(q_row + static_cast<int64_t>(h0) * Dh);
  constexpr int kIters = kHeadsTc * Dh / 4 / kThreadsTc;
  float4 v[kIters];  // every load in flight before the first store
#pragma unroll
  for (int u = 0; u < kIters; ++u) {
    const int i = static_cast<int>(threadIdx.x) + u * kThreadsTc;
    v[u] = h0 + i / (Dh / 4) < a.H ? __ldg(src + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
#pragma unroll
  for (int u = 0; u < kIters; ++u) {
    const int i = static_cast<int>(threadIdx.x) + u * kThreadsTc, h = i / (Dh / 4), d = 4 * (i % (Dh / 4));
    *reinterpret_cast<__nv_bfloat162*>(&s.q[h][d]) = __floats2bfloat162_rn(v[u].x, v[u].y);
    *reinterpret_cast<__nv_bfloat162*>(&s.q[h][d + 2]) = __floats2bfloat162_rn(v[u].z, v[u].w);
  }
  const RopeArgs rope = a.rope;
  if (rope.freqs == nullptr) return;
  __syncthreads();  // the unrotated values written
  const int tail0 = Dh - 2 * rope.half, heads = min(kHeadsTc, a.H - h0);
  const float at = static_cast<float>(cuda::scalar_value(rope.pos0_value, rope.pos0_dev) + t);
#pragma unroll 1
  for (int i = threadIdx.x; i < heads * rope.half; i += kThreadsTc) {
    const int h = i / rope.half, p = i % rope.half, d = tail0 + 2 * p;
    const float* qp = q_row + static_cast<int64_t>(h0 + h) * Dh + d;
    float t[2] = {qp[0], qp[1]};
    rope::detail::rotate_pair(t, 0, at * rope.freqs[p], false);
    *reinterpret_cast<__nv_bfloat162*>(&s.q[h][d]) = __floats2bfloat162_rn(t[0], t[1]);
  }
}

// Chunk c of row t's list: its rows (null: no entry) and, as bf16, their values (zeros for
// none); returns how many entries the chunk has.
template <int Dh>
__device__ __forceinline__ int load_rows(const TcArgs& a, int64_t t, int c, TcSmem<Dh>& s) {
  const WindowArgs win = a.win;
  const int64_t e0 = static_cast<int64_t>(c) * kChunkTc, pos0 = win.ww > 0 ? cuda::scalar_value(win.pos0_value, win.pos0_dev) : 0;
  const int cn = static_cast<int>(min(static_cast<int64_t>(kChunkTc), a.width - e0));
  if (threadIdx.x < kChunkTc) {
    const int k = static_cast<int>(threadIdx.x);
    const int32_t* list = a.idx + t * (a.width - win.ww);
    s.rows[k] = k < cn ? kv_row(a.kv_a, a.n_a, a.kv_b, Dh, list_entry(win, pos0, a.S, t, list, e0 + k)) : nullptr;
  }
  __syncthreads();
  // Loads in batches of 16 a thread (64 KB in flight a CTA), each batch's loads issued before its
  // stores: a store to shared memory between them would hold each load back until the one before
  // it has landed (the row pointers are in shared memory too).
  constexpr int kVec = Dh / 4, kIters = kChunkTc * kVec / kThreadsTc, kBatch = kIters < 16 ? kIters : 16;
#pragma unroll 1  // the batches rolled: code size (instruction-cache misses)
  for (int b = 0; b < kIters; b += kBatch) {
    float4 v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = static_cast<int>(threadIdx.x) + (b + u) * kThreadsTc;
      const float* row = s.rows[i / kVec];
      v[u] = row != nullptr ? __ldg(reinterpret_cast<const float4*>(row + 4 * (i % kVec))) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = static_cast<int>(threadIdx.x) + (b + u) * kThreadsTc, k = i / kVec, d = 4 * (i % kVec);
      *reinterpret_cast<__nv_bfloat162*>(&s.kv[k][d]) = __floats2bfloat162_rn(v[u].x, v[u].y);
      *reinterpret_cast<__nv_bfloat162*>(&s.kv[k][d + 2]) = __floats2bfloat162_rn(v[u].z, v[u].w);
    }
  }
  __syncthreads();
  return cn;
}

// Logits of the CTA's heads over the chunk (warp w: entries 8w .. 8w + 7), scaled, -inf for no
// entry; then each head's chunk max.
template <int Dh>
__device__ __forceinline__ void chunk_logits(const TcArgs& a, int j, TcSmem<Dh>& s) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const __nv_bfloat16* krow = s.kv[8 * warp + g];
#pragma unroll 8
  for (int k0 = 0; k0 < Dh; k0 += 16) {
    mma_bf16(d, word_of(&s.q[g][k0 + 2 * t]), word_of(&s.q[g + 8][k0 + 2 * t]), word_of(&s.q[g][k0 + 2 * t + 8]),
             word_of(&s.q[g + 8][k0 + 2 * t + 8]), word_of(krow + k0 + 2 * t), word_of(krow + k0 + 2 * t + 8));
  }
  // d: heads g (d[0], d[1]) and g + 8 (d[2], d[3]), entries 8 warp + 2t, + 1.
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int h = g + 8 * (i / 2), k = 8 * warp + 2 * t + (i % 2);
    s.logit[j][h][k] = s.rows[k] != nullptr ? d[i] * a.scale : -INFINITY;
  }
  __syncthreads();
  for (int h = warp; h < kHeadsTc; h += kWarpsTc) {
    float m = fmaxf(s.logit[j][h][lane], s.logit[j][h][lane + 32]);
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (lane == 0) s.cmax[j][h] = m;
  }
  __syncthreads();  // the rows free for the next chunk
}

// p against the running max m (per head), their sum in entry order (unrounded, over the chunk's
// cn entries) and bf16 p, as sparse_values_kernel.
template <int Dh>
__device__ __forceinline__ void chunk_probs(TcSmem<Dh>& s, int j, int cn) {
  float (&pf)[kHeadsTc][kChunkTc] = s.logit[j];
#pragma unroll 1
  for (int i = threadIdx.x; i < kHeadsTc * kChunkTc; i += kThreadsTc) {
    const int h = i / kChunkTc, k = i % kChunkTc;
    pf[h][k] = k < cn ? expf(pf[h][k] - s.m_run[j][h]) : 0.0f;  // p, unrounded
  }
  __syncthreads();
  if (threadIdx.x < kHeadsTc) {
    const int h = static_cast<int>(threadIdx.x);
    float sum = 0.0f;
#pragma unroll 16
    for (int k = 0; k < cn; ++k) sum = __fadd_rn(sum, pf[h][k]);
    s.psum[j][h] = sum;
  }
#pragma unroll 1
  for (int i = threadIdx.x; i < kHeadsTc * kChunkTc; i += kThreadsTc) {
    const int h = i / kChunkTc, k = i % kChunkTc;
    s.p[h][k] = __float2bfloat16_rn(pf[h][k]);
  }
  __syncthreads();
}

template <int Dh>
using ValueTiles = float[Dh / kWarpsTc / 8][4];  // a warp's value sums: n8 tiles

// The chunk's value sums P V of the CTA's heads (warp w: dims 64w .. 64w + 63), in registers.
template <int Dh>
__device__ __forceinline__ void chunk_values(const TcSmem<Dh>& s, ValueTiles<Dh>& acc) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < (Dh / kWarpsTc / 8); ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
  for (int k0 = 0; k0 < kChunkTc; k0 += 16) {
    const uint32_t a0 = word_of(&s.p[g][k0 + 2 * t]), a1 = word_of(&s.p[g + 8][k0 + 2 * t]);
    const uint32_t a2 = word_of(&s.p[g][k0 + 2 * t + 8]), a3 = word_of(&s.p[g + 8][k0 + 2 * t + 8]);
#pragma unroll
    for (int j = 0; j < (Dh / kWarpsTc / 8); ++j) {
      uint32_t b0, b1;
      ldmatrix_x2_trans(b0, b1, &s.kv[k0 + (lane & 15)][(Dh / kWarpsTc) * warp + 8 * j]);
      mma_bf16(acc[j], a0, a1, a2, a3, b0, b1);
    }
  }
}

// Stores value sums as part slot j (the rows' space: once every warp is done with the rows).
template <int Dh>
__device__ __forceinline__ void store_part(TcSmem<Dh>& s, int slot, const ValueTiles<Dh>& acc) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float* part = reinterpret_cast<float*>(&s.kv[0][0]) + slot * kHeadsTc * Dh;
#pragma unroll
  for (int j = 0; j < (Dh / kWarpsTc / 8); ++j) {
    const int d0 = (Dh / kWarpsTc) * warp + 8 * j + 2 * t;
    part[g * Dh + d0] = acc[j][0], part[g * Dh + d0 + 1] = acc[j][1];
    part[(g + 8) * Dh + d0] = acc[j][2], part[(g + 8) * Dh + d0 + 1] = acc[j][3];
  }
}

// Copies field f of every chunk's CTA into dst[chunk][head]: one load a thread.
template <int Dh>
__device__ __forceinline__ void gather(const cg::cluster_group& cluster, float (TcSmem<Dh>::*f)[kChunksCta][kHeadsTc],
                                      TcSmem<Dh>& s, float (*dst)[kHeadsTc], ChunkMap map) {
  if (threadIdx.x < kHeadsTc * map.chunks) {
    const int q = static_cast<int>(threadIdx.x) / kHeadsTc, h = static_cast<int>(threadIdx.x) % kHeadsTc;
    dst[q][h] = (cluster.map_shared_rank(&s, q / map.per)->*f)[q % map.per][h];
  }
}

// The running max of every head through each of the CTA's chunks (the reference's chunk loop).
template <int Dh>
__device__ __forceinline__ void running_max(TcSmem<Dh>& s, int q0, int mine) {
  if (threadIdx.x < kHeadsTc) {
    const int h = static_cast<int>(threadIdx.x);
    float m = -1e30f;
    for (int q = 0; q < q0 + mine; ++q) {
      m = fmaxf(m, s.cmax_all[q][h]);
      if (q >= q0) s.m_run[q - q0][h] = m;
    }
  }
}

// The merge's factors of every head: the running max over the chunks in order, each chunk's
// rescale and the sum L (with the sink), as the reference's chunk loop.
template <int Dh>
__device__ __forceinline__ void merge_factors(const TcArgs& a, int h0, int chunks, TcSmem<Dh>& s) {
  if (threadIdx.x < kHeadsTc) {
    const int h = static_cast<int>(threadIdx.x);
    float m = -1e30f, l = 0.0f;
    for (int q = 0; q < chunks; ++q) {
      const float m_new = fmaxf(m, s.cmax_all[q][h]), r = expf(m - m_new);
      s.resc[h][q] = r;
      l = __fadd_rn(__fmul_rn(l, r), s.psum_all[q][h]);
      m = m_new;
    }
    s.L[h] = h0 + h < a.H ? __fadd_rn(l, expf(a.sink[h0 + h] - m)) : 1.0f;
  }
}

// Heads c, c + n, ... of the 16 (c: this CTA's rank, n: the cluster's): every chunk's part merged
// in chunk order, divided by L and rounded; dims below the RoPE's go out, the RoPE's are rotated
// back first (stashed in the logits' space).
template <int Dh>
__device__ __forceinline__ void write_out(const cg::cluster_group& cluster, const TcArgs& a, int64_t t, int h0,
                                          ChunkMap map, TcSmem<Dh>& s) {
  const int c = static_cast<int>(cluster.block_rank()), n = static_cast<int>(cluster.num_blocks());
  float* o_row = a.o + t * a.H * Dh;
  const RopeArgs rope = a.rope;
  const int tail = rope.freqs != nullptr ? 2 * rope.half : 0, tail0 = Dh - tail;
  const int mine = (min(kHeadsTc, a.H - h0) - c + n - 1) / n;  // heads c + j n < H - h0
  float* stash = &s.logit[0][0][0];  // [mine][tail]
  for (int it = threadIdx.x; it < mine * (Dh / 4); it += kThreadsTc) {
    const int j = it / (Dh / 4), d = 4 * (it % (Dh / 4)), h = c + j * n;
    // Four chunks' parts loaded before their sums; a rolled loop: this code runs once a CTA, so
    // every instruction of it is an instruction-cache miss, and unrolled it cost more than it saved.
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int q0 = 0; q0 < map.chunks; q0 += 4) {
      float4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (q0 + u < map.chunks) v[u] = *reinterpret_cast<const float4*>(s.part_of[q0 + u] + h * Dh + d);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (q0 + u < map.chunks) {
          const float r = s.resc[h][q0 + u];
          acc.x = __fadd_rn(__fmul_rn(acc.x, r), v[u].x), acc.y = __fadd_rn(__fmul_rn(acc.y, r), v[u].y);
          acc.z = __fadd_rn(__fmul_rn(acc.z, r), v[u].z), acc.w = __fadd_rn(__fmul_rn(acc.w, r), v[u].w);
        }
      }
    }
    const float L = s.L[h];
    const float out[4] = {__bfloat162float(__float2bfloat16_rn(__fdiv_rn(acc.x, L))),
                          __bfloat162float(__float2bfloat16_rn(__fdiv_rn(acc.y, L))),
                          __bfloat162float(__float2bfloat16_rn(__fdiv_rn(acc.z, L))),
                          __bfloat162float(__float2bfloat16_rn(__fdiv_rn(acc.w, L)))};
    for (int e = 0; e < 4; ++e) {
      if (d + e < tail0) {
        o_row[static_cast<int64_t>(h0 + h) * Dh + d + e] = out[e];
      } else {
        stash[j * tail + d + e - tail0] = out[e];
      }
    }
  }
  if (tail == 0) return;
  __syncthreads();
  const float at = static_cast<float>(cuda::scalar_value(rope.pos0_value, rope.pos0_dev) + t);
  for (int it = threadIdx.x; it < mine * rope.half; it += kThreadsTc) {
    const int j = it / rope.half, p = it % rope.half;
    float* pair = stash + j * tail + 2 * p;
    rope::detail::rotate_pair(pair, 0, at * rope.freqs[p], true);
    float* o = o_row + static_cast<int64_t>(h0 + c + j * n) * Dh + tail0 + 2 * p;
    o[0] = pair[0], o[1] = pair[1];
  }
}

// The value sums of the CTA's chunks q0 .. q0 + mine - 1 (mine <= 2) into its part slots: the
// last chunk's rows are still in shared memory, the first's are gathered again.
template <int Dh>
__device__ __forceinline__ void values_of_chunks(const TcArgs& a, int64_t t, int q0, int mine,
                                                 const int (&cn)[kChunksCta], TcSmem<Dh>& s) {
  ValueTiles<Dh> last, first;
  chunk_probs(s, mine - 1, mine == 2 ? cn[1] : cn[0]);
  chunk_values(s, last);
  if (mine == 2) {
    __syncthreads();  // every warp done with the rows and p
    load_rows(a, t, q0, s);
    chunk_probs(s, 0, cn[0]);
    chunk_values(s, first);
  }
  __syncthreads();  // every warp done with the rows
  store_part(s, mine - 1, last);
  if (mine == 2) store_part(s, 0, first);
}

// grid (n, ceil(H / kHeadsTc), S), a cluster of n CTAs along x: CTA c takes chunks per c .. per
// c + per - 1 of row blockIdx.z's list (per = ceil(chunks / a.cluster), n = ceil(chunks / per))
// for heads 16 blockIdx.y ... (past H: zeros, no output). kMinCtas: the CTAs a SM holds at once,
// 1 for a decode row (latency: every register it wants) or 2 for a prefill chunk's rows
// (throughput: the shared memory holds two, the registers then at most 128 a thread).
template <int Dh, int kMinCtas>
__global__ void __launch_bounds__(kThreadsTc, kMinCtas) sparse_tc_kernel(const __grid_constant__ TcArgs a) {
  cuda::await_inputs();
  extern __shared__ __align__(16) uint8_t smem_raw[];
  TcSmem<Dh>& s = *reinterpret_cast<TcSmem<Dh>*>(smem_raw);
  cg::cluster_group cluster = cg::this_cluster();
  const ChunkMap map = chunk_map(a.width, a.cluster);
  const int q0 = map.per * static_cast<int>(blockIdx.x), mine = min(map.per, map.chunks - q0);
  const int h0 = kHeadsTc * static_cast<int>(blockIdx.y);
  const int64_t t = blockIdx.z;
  load_q(a, t, h0, s);
  int cn[kChunksCta] = {0, 0};
#pragma unroll 1  // one copy of the code: it runs once a CTA (instruction-cache misses)
  for (int j = 0; j < mine; ++j) {
    const int n_j = load_rows(a, t, q0 + j, s);
    cn[0] = j == 0 ? n_j : cn[0], cn[1] = j == 1 ? n_j : cn[1];
    chunk_logits(a, j, s);
  }
  cluster.sync();  // every chunk's maxima written
  gather(cluster, &TcSmem<Dh>::cmax, s, s.cmax_all, map);
  __syncthreads();
  running_max(s, q0, mine);
  __syncthreads();
  values_of_chunks(a, t, q0, mine, cn, s);
  cluster.sync();  // every chunk's value sums and sums written
  gather(cluster, &TcSmem<Dh>::psum, s, s.psum_all, map);
  if (threadIdx.x < map.chunks) {
    const int q = static_cast<int>(threadIdx.x);
    s.part_of[q] = reinterpret_cast<const float*>(&cluster.map_shared_rank(&s, q / map.per)->kv[0][0]) +
                   (q % map.per) * kHeadsTc * Dh;
  }
  __syncthreads();
  merge_factors(a, h0, map.chunks, s);
  __syncthreads();
  write_out(cluster, a, t, h0, map, s);
  cluster.sync();  // no CTA leaves while another reads its shared memory
}

// False for a query's error, which is cleared (not the stream's).
bool query_ok(cudaError_t e) {
  if (e == cudaSuccess) return true;
  (void)cudaGetLastError();
  return false;
}

// Whether a cluster of `size` CTAs of the kernel at Dh (with its shared memory) can be resident.
template <int Dh>
bool clusters_resident(int size) {
  cudaLaunchAttribute cluster = cuda::cluster_attr(static_cast<unsigned>(size));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(size));
  cfg.blockDim = dim3(kThreadsTc);
  cfg.dynamicSmemBytes = sizeof(TcSmem<Dh>);
  cfg.attrs = &cluster;
  cfg.numAttrs = 1;
  int clusters = 0;
  return query_ok(cudaOccupancyMaxActiveClusters(&clusters, sparse_tc_kernel<Dh, 1>, &cfg)) && clusters > 0;
}

}  // namespace

// Whether this device runs the kernel at Dh: cluster launches, its shared memory (~98 KB)
// granted and a cluster of kMaxCluster CTAs of it resident at once (not every device has
// clusters or that much memory a CTA; where one lacks them the split kernels take every call).
template <int Dh>
bool tc_resources_granted() {
  int dev = 0, clusters_ok = 0;
  if (!query_ok(cudaGetDevice(&dev)) || !query_ok(cudaDeviceGetAttribute(&clusters_ok, cudaDevAttrClusterLaunch, dev)) ||
      clusters_ok == 0) {
    return false;
  }
  const int bytes = static_cast<int>(sizeof(TcSmem<Dh>));
  return query_ok(cudaFuncSetAttribute(sparse_tc_kernel<Dh, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)) &&
         query_ok(cudaFuncSetAttribute(sparse_tc_kernel<Dh, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)) &&
         clusters_resident<Dh>(kMaxCluster);
}

// Whether clusters of kWideCluster CTAs of the kernel (a non-portable size) can be resident,
// after tc_resources_granted: then lists of 9 to 16 chunks take a CTA a chunk, the rows of
// each gathered once, instead of two chunks a CTA (three gathers).
template <int Dh>
bool wide_cluster_granted() {
  return query_ok(cudaFuncSetAttribute(sparse_tc_kernel<Dh, 1>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1)) &&
         query_ok(cudaFuncSetAttribute(sparse_tc_kernel<Dh, 2>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1)) &&
         clusters_resident<Dh>(kWideCluster);
}

// The device's answers, asked once: whether the kernel runs (0) and its largest cluster.
template <int Dh>
int device_tc_cluster() {
  static const int cluster = [] {
    // The first call may come while a stream is captured (a graph decode step): these queries
    // are not stream work, so this thread may make them in relaxed capture mode.
    const cuda::RelaxedCapture relaxed;
    if (!relaxed.ok()) return 0;
    return !tc_resources_granted<Dh>() ? 0 : wide_cluster_granted<Dh>() ? kWideCluster : kMaxCluster;
  }();
  return cluster;
}

template <int Dh>
bool device_runs_tc() {
  return device_tc_cluster<Dh>() > 0;
}

// The cluster a call takes: the device's largest, or the portable 8 with DSF_ATTN_TC_CLUSTER=8
// (read at each call: the tests run both).
template <int Dh>
int tc_cluster() {
  return cuda::env_int("DSF_ATTN_TC_CLUSTER", kWideCluster) <= kMaxCluster ? kMaxCluster : device_tc_cluster<Dh>();
}

bool tc_applies(int64_t S, int H, int64_t Dh, int64_t width, int rope_half, const float* q, const float* kv_a,
                const float* kv_b) {
  static const bool on = cuda::env_int("DSF_ATTN_TC", 1) != 0;  // DSF_ATTN_TC=0: the split kernels (measurement)
  // DSF_ATTN_TC_ROWS=0: one-row calls only, the rows of a prefill chunk on the split kernels
  // (measurement).
  static const bool rows = cuda::env_int("DSF_ATTN_TC_ROWS", 1) != 0;
  const int64_t chunks = (width + kChunkTc - 1) / kChunkTc;  // not chunk_map's: width may be past int
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return on && S >= 1 && S <= kMaxRowsTc && (S == 1 || rows) && head_dim_tc(Dh) &&
         2 * rope_half <= std::min<int64_t>(kRopeTc, Dh) && H >= 1 && chunks >= 1 && chunks <= kMaxChunks && aligned(q) && aligned(kv_a) && (kv_b == nullptr || aligned(kv_b)) &&
         (Dh == 512 ? device_runs_tc<512>() : device_runs_tc<64>());
}

template <int Dh>
Status launch_tc(cudaStream_t st, TcArgs args) {
  args.cluster = tc_cluster<Dh>();
  const unsigned n = static_cast<unsigned>(chunk_map(args.width, args.cluster).ctas());
  const unsigned groups = static_cast<unsigned>((args.H + kHeadsTc - 1) / kHeadsTc);
  const unsigned rows = static_cast<unsigned>(args.S);
  const cuda::LaunchParams lp{dim3(n, groups, rows), dim3(kThreadsTc), sizeof(TcSmem<Dh>), st, n};
  // A prefill chunk's rows on the two-a-SM form unless DSF_ATTN_TC_ROWS_CTAS=1 (measurement).
  static const bool two = cuda::env_int("DSF_ATTN_TC_ROWS_CTAS", 2) >= 2;
  return args.S > 1 && two ? cuda::launch(sparse_tc_kernel<Dh, 2>, lp, args)
                           : cuda::launch(sparse_tc_kernel<Dh, 1>, lp, args);
}

Status sparse_attn_tc(cudaStream_t st, const float* q, int64_t S, int H, int64_t Dh, const float* kv_a, int64_t n_a,
                      const float* kv_b, const int32_t* idx, int64_t width, const float* sink, float scale, float* o,
                      const RopeArgs& rope, const WindowArgs& win) {
  if (!tc_applies(S, H, Dh, width, rope.freqs != nullptr ? rope.half : 0, q, kv_a, kv_b)) {
    return absl::InternalError("sparse_attn_tc: a call it does not take");
  }
  const TcArgs args{q, S, H, kv_a, n_a, kv_b, idx, width, sink, scale, rope, win, o, kMaxCluster};
  return Dh == 512 ? launch_tc<512>(st, args) : launch_tc<64>(st, args);
}

}  // namespace dsflash::kernels::attn::detail
