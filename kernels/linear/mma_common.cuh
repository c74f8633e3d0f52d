// Shared by the tensor-core decode GEMVs (gemv_mma.cu) and prefill GEMMs (gemm_mma.cu): the
// int8 mma, the split of a 256-column block of x into exact digits (digits.h), the words of the
// mins' operand, and the K-quant block readers both take their A operands from.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/linear/digits.h"
#include "kernels/linear/tiles.h"

namespace dsflash::kernels::mma {

using digits::kDigits;

// A digit row's pitch in shared memory (256 bytes padded): the 8-byte loads of the 16 lanes
// (g, t) that read digit row g % 4 at bytes 8t.. of one token then hit 32 distinct banks.
constexpr int kQRow = 288;

// d += A B: A 16 x 32 (row major, lane (g, t): rows g and g + 8, k = 4t.. and 16 + 4t..), B 32 x 8
// (column g, the same k), s8 in, s32 sums.
__device__ __forceinline__ void mma_s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint2 b) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y));
}

// mma_s8 with A unsigned (u8: codes times a scale up to 255).
__device__ __forceinline__ void mma_u8s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint2 b) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y));
}

// d += A B with k = 16: A 16 x 16 (lane (g, t): rows g and g + 8, k = 4t..), B 16 x 8 (column g,
// the same k).
__device__ __forceinline__ void mma_s8_k16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
               : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
               : "r"(a0), "r"(a1), "r"(b));
}

__device__ __forceinline__ uint32_t nibbles(uint32_t w, int hi) { return (hi ? w >> 4 : w) & 0x0f0f0f0fu; }
__device__ __forceinline__ int byte_of(uint32_t w, int k) { return static_cast<int>((w >> (8 * k)) & 0xffu); }
__device__ __forceinline__ float half_lo(uint32_t w) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
}
__device__ __forceinline__ float half_hi(uint32_t w) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
}

// The blocks' fp32 epilogue with every rounding fixed: acc + s x (one fma) and d x - m y (an
// fma on the rounded m y). As plain expressions the compiler may contract them into fmas or
// not, and may choose differently in two instances of one reader (the GGUF order against the
// tiles of tiles.h, which must agree bit for bit); products by powers of two (S, the digit
// weights, 1/16, 4) are exact, so they need no such care.
__device__ __forceinline__ float acc_fma(float acc, float s, float x) { return __fmaf_rn(s, x, acc); }
__device__ __forceinline__ float scaled_diff(float d, float x, float m, float y) { return __fmaf_rn(d, x, -__fmul_rn(m, y)); }

// Word t of four little-endian words (a select chain: a register array indexed by a lane's t
// would live in local memory).
__device__ __forceinline__ uint32_t word_at(const uint32_t (&w)[4], int t) {
  return t == 0 ? w[0] : t == 1 ? w[1] : t == 2 ? w[2] : w[3];
}

// Splits one block of x (256 values, 16-byte aligned) on a whole warp (lane l: columns 8l ..
// 8l + 7): digit j's 256 bytes at q + j pitch, their sums over each 16 columns at sums[16 j + c],
// and returns the block's scale S on every lane (NaN where the block holds a NaN or infinity,
// so every product with it is NaN).
__device__ __forceinline__ float split_block(const float* x, int lane, int8_t* q, int pitch, int32_t* sums) {
  const float4* x4 = reinterpret_cast<const float4*>(x + 8 * lane);
  const float4 u = x4[0], w = x4[1];
  const float v[8] = {u.x, u.y, u.z, u.w, w.x, w.y, w.z, w.w};
  // max |v| by the magnitudes' bits (ordered as the floats; a NaN or infinity is >= 0x7f800000).
  unsigned mbits = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) mbits = max(mbits, __float_as_uint(v[i]) & 0x7fffffffu);
  for (int off = 16; off > 0; off >>= 1) mbits = max(mbits, __shfl_xor_sync(0xffffffffu, mbits, off));
  // S = 2^(e - 5) puts max|x| / S in [32, 64): q0 within [-64, 64].
  const bool finite = mbits < 0x7f800000u;
  const int e = finite ? digits::scale_exponent(__uint_as_float(mbits)) : 0;
  const digits::Scale sc = digits::scale_of(e);
  int nb[2][4];
#pragma unroll
  for (int i = 0; i < 8; ++i) nb[i / 4][i % 4] = digits::biased(finite ? v[i] : 0.0f, sc);
#pragma unroll
  for (int j = 0; j < kDigits; ++j) {
    const unsigned w0 = digits::pack_digit(nb[0], j), w1 = digits::pack_digit(nb[1], j);
    *reinterpret_cast<uint2*>(q + j * pitch + 8 * lane) = make_uint2(w0, w1);
    const int sum = digits::sum_bytes(w0) + digits::sum_bytes(w1);
    const int s = sum + __shfl_xor_sync(0xffffffffu, sum, 1);  // 16 columns: two lanes
    if ((lane & 1) == 0) sums[16 * j + lane / 2] = s;
  }
  return finite ? ldexpf(1.0f, e - 5) : __int_as_float(0x7fc00000);
}

// Word (g, t) of a block's mins operand, from digit g % 4's 16-column sums (sums16). kSub: the
// type's sub-block columns (32: Q4_K, 8 sub-blocks, t < 2; 16: Q2_K and Q3_K, 16 sub-blocks,
// t < 4). Byte i is, for sub-block s = 4t + i, the low (g < 4) or high (g >= 4) radix-128 digit
// of the digit's sum over s (|sum| <= 2048: low in [-64, 63], high in [-16, 16]), so that an
// mma with a row's sub-block weights at k = s gives low + 128 high = the exact sum.
template <int kSub>
__device__ __forceinline__ uint32_t mins_word(const int32_t* sums16, int g, int t) {
  int sums[4];
  if constexpr (kSub == 32) {
    const int4* s16 = reinterpret_cast<const int4*>(sums16) + 2 * t;
    const int4 a = s16[0], b = s16[1];
    sums[0] = a.x + a.y, sums[1] = a.z + a.w, sums[2] = b.x + b.y, sums[3] = b.z + b.w;
  } else {
    const int4 a = reinterpret_cast<const int4*>(sums16)[t];
    sums[0] = a.x, sums[1] = a.y, sums[2] = a.z, sums[3] = a.w;
  }
  uint32_t word = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int lo = ((sums[k] + 64) & 127) - 64;
    const int part = g < 4 ? lo : (sums[k] - lo) >> 7;
    word |= (static_cast<uint32_t>(part) & 0xffu) << (8 * k);
  }
  return word;
}

// A Q4_K block's header (one 16-byte load): d, dmin and the 6-bit scales and mins of sub-blocks
// 0..3 (lo) and 4..7 (hi) as bytes.
struct Q4KHeader {
  __device__ __forceinline__ explicit Q4KHeader(const uint8_t* blk) {
    const uint4 h = *reinterpret_cast<const uint4*>(blk);
    d = half_lo(h.x), dmin = half_hi(h.x);
    sc_lo = h.y & 0x3f3f3f3fu, m_lo = h.z & 0x3f3f3f3fu;
    sc_hi = (h.w & 0x0f0f0f0fu) | ((h.y >> 2) & 0x30303030u);
    m_hi = ((h.w >> 4) & 0x0f0f0f0fu) | ((h.z >> 2) & 0x30303030u);
  }
  __device__ __forceinline__ int sc(int s) const { return byte_of(s < 4 ? sc_lo : sc_hi, s % 4); }
  float d, dmin;
  uint32_t sc_lo, m_lo, sc_hi, m_hi;
};

// Two rows' Q2_K blocks (84 bytes, 4-byte aligned: scales[16] (4-bit scale | 4-bit min), qs[64],
// d, dmin) as lane t reads them, every word loaded by the constructor. Column 128n + 32j + l
// has code (qs[32n + l] >> 2j) & 3 in sub-block 8n + 2j + l / 16; lane t takes l = 8t .. 8t + 7,
// one sub-block's codes, so a(n, j) folds its 4-bit scale into them (a packed multiply: code x
// scale <= 45, no byte carries): rows a, b at k = 4t.. (columns 8t .. 8t + 3), then rows a, b at
// k = 16 + 4t... Lane t loads scale word t of each row (sub-blocks 4t ..), the one its mins
// take; the others come from the lanes of its quad (a shuffle instead of a load).
struct Q2KRows {
  // The same words from a (tile, block) of the tile layout (tiles.h): four loads a lane, each
  // of the warp's a contiguous run.
  __device__ __forceinline__ static Q2KRows from_tile(const uint8_t* tile, int g, int t) {
    Q2KRows r(t);
    const int lane = 4 * g + t;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const uint4 c = *reinterpret_cast<const uint4*>(tile + 512 * n + 16 * lane);
      r.q[n][0] = c.x, r.q[n][1] = c.y, r.q[n][2] = c.z, r.q[n][3] = c.w;
    }
    const uint2 sc = *reinterpret_cast<const uint2*>(tile + 1024 + 8 * lane);
    const uint2 dd = *reinterpret_cast<const uint2*>(tile + 1280 + 8 * g);
    r.sc[0] = sc.x, r.sc[1] = sc.y, r.dd[0] = dd.x, r.dd[1] = dd.y;
    return r;
  }
  // Rows g and g + 8 (ba, bb: their blocks in the GGUF order, or with kTiled, ba the (tile,
  // block)).
  template <bool kTiled>
  __device__ __forceinline__ static Q2KRows load(const uint8_t* ba, const uint8_t* bb, int g, int t) {
    if constexpr (kTiled) {
      return from_tile(ba, g, t);
    } else {
      return Q2KRows(ba, bb, t);
    }
  }
  __device__ __forceinline__ Q2KRows(const uint8_t* ba, const uint8_t* bb, int t) : t_(t) {
    const uint32_t *wa = reinterpret_cast<const uint32_t*>(ba), *wb = reinterpret_cast<const uint32_t*>(bb);
    sc[0] = wa[t], sc[1] = wb[t];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int w = 4 + 8 * n + 2 * t;  // qs[32n + 8t ..] as words
      q[n][0] = wa[w], q[n][1] = wb[w], q[n][2] = wa[w + 1], q[n][3] = wb[w + 1];
    }
    dd[0] = wa[20], dd[1] = wb[20];
  }
  // Scale word w (sub-blocks 4w ..) of row a (0) or b (1): lane w of the quad's.
  __device__ __forceinline__ uint32_t scale_word(int row, int w) const {
    return __shfl_sync(0xffffffffu, sc[row], w, 4);
  }
  // A block's four scale words, loaded (the prefill GEMM's a(); the decode GEMV shares them
  // by scale_word instead).
  __device__ __forceinline__ static void scale_words(const uint8_t* blk, uint32_t (&w)[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = reinterpret_cast<const uint32_t*>(blk)[k];
  }
  // The A operand of bit pair j of half n, rows a and b's scale words given (scale_words).
  __device__ __forceinline__ void a(int n, int j, const uint32_t (&sca)[4], const uint32_t (&scb)[4],
                                    uint32_t (&out)[4]) const {
    const int s = 8 * n + 2 * j + (t_ >> 1);
    const uint32_t fa = static_cast<uint32_t>(byte_of(sca[s / 4], s % 4) & 0xf);
    const uint32_t fb = static_cast<uint32_t>(byte_of(scb[s / 4], s % 4) & 0xf);
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = ((q[n][k] >> (2 * j)) & 0x03030303u) * (k % 2 == 0 ? fa : fb);
  }
  // The A operands of bit pairs j = 2p and 2p + 1 of half n, cheaper than two a(): even[] as
  // a(n, 2p), odd4[] 4 x a(n, 2p + 1) (the codes masked where they lie, bits 2..3 of each byte:
  // up to 180, so unsigned; its mma sums are 4 x theirs, exactly). Each scale is one byte
  // permute of a masked scale word: bytes h and 2 + h (h = t / 2) of word 2n + p.
  __device__ __forceinline__ void a_pair(int n, int p, uint32_t (&even)[4], uint32_t (&odd4)[4]) const {
    const int w = 2 * n + p;
    const uint32_t ma = scale_word(0, w) & 0x0f0f0f0fu, mb = scale_word(1, w) & 0x0f0f0f0fu;
    const uint32_t sel = 0x4440u | static_cast<uint32_t>(t_ >> 1);  // byte h, zeros above
    const uint32_t fa = __byte_perm(ma, 0u, sel), fb = __byte_perm(mb, 0u, sel);
    const uint32_t fa4 = __byte_perm(ma, 0u, sel + 2u), fb4 = __byte_perm(mb, 0u, sel + 2u);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t base = p == 0 ? q[n][k] : q[n][k] >> 4;
      even[k] = (base & 0x03030303u) * (k % 2 == 0 ? fa : fb);
      odd4[k] = (base & 0x0c0c0c0cu) * (k % 2 == 0 ? fa4 : fb4);
    }
  }
  // A of the mins' mma: a row's 4-bit mins (the scale bytes' high nibbles) at k = sub-block.
  __device__ __forceinline__ uint32_t mins_a(int row) const { return (sc[row] >> 4) & 0x0f0f0f0fu; }
  // d and dmin of row a (0) or b (1) as a word of two halves (half_lo, half_hi).
  __device__ __forceinline__ uint32_t d_dmin(int row) const { return dd[row]; }
  uint32_t sc[2];    // scale word t of rows a, b
  uint32_t q[2][4];  // per half n: row a k = 4t.., row b, row a k = 16 + 4t.., row b
  uint32_t dd[2];

 private:
  __device__ __forceinline__ explicit Q2KRows(int t) : t_(t) {}
  int t_;
};

// A block's bytes by their GGUF offsets, from the GGUF order (2-byte aligned) or from a row's
// place in a Q3_K (tile, block) (tiles.h; words at offsets of 4 below 108).
struct GgufBlockView {
  const uint8_t* blk;
  __device__ __forceinline__ uint32_t word(int o) const {  // two half-word loads
    const uint16_t* h = reinterpret_cast<const uint16_t*>(blk + o);
    return h[0] | (static_cast<uint32_t>(h[1]) << 16);
  }
  __device__ __forceinline__ unsigned short half(int o) const { return *reinterpret_cast<const unsigned short*>(blk + o); }
};
struct Q3KTileView {
  const uint8_t* tile;
  int r;  // the row in the tile
  __device__ __forceinline__ uint32_t word(int o) const {
    return *reinterpret_cast<const uint32_t*>(tile + tiles::q3k_byte(r, o));
  }
  __device__ __forceinline__ unsigned short half(int o) const {
    return *reinterpret_cast<const unsigned short*>(tile + tiles::q3k_byte(r, o));
  }
};

// A Q3_K block (110 bytes, 2-byte aligned: hmask[32], qs[64], 12 bytes of 6-bit scales, d) as
// lane t reads it: its unsigned scales (4 words of 4), the codes' words and high bits of columns
// 128n + 32j + 8t .. 8t + 7. Column 128n + 32j + l has code c = ((qs[32n + l] >> 2j) & 3) |
// (bit 4n + j of hmask[l]) << 2 in sub-block 8n + 2j + l / 16, value d (u_s - 32)(c - 4).
struct Q3KRow {
  __device__ __forceinline__ static uint32_t word(const uint8_t* p) {  // two half-word loads
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return h[0] | (static_cast<uint32_t>(h[1]) << 16);
  }
  // The little-endian word at p (2-byte aligned): one load where kAligned (p 4-byte aligned),
  // else word()'s two half-words.
  template <bool kAligned>
  __device__ __forceinline__ static uint32_t word_at(const uint8_t* p) {
    if constexpr (kAligned) return *reinterpret_cast<const uint32_t*>(p);
    return word(p);
  }
  // Word k (k < 4) of the block's 16 unsigned 6-bit scales, a byte each: sub-blocks 4k ..
  // 4k + 3 (low 4 bits: nibble k / 2 of bytes 96 + 4 (k % 2) ..; high 2: bits 2k of bytes 104 ..).
  // Word k from the scale bytes' words lo (bytes 96 + 4 (k & 1) ..) and hi (bytes 104 ..).
  __device__ __forceinline__ static uint32_t scale_of(uint32_t lo, uint32_t hi, int k) {
    return ((lo >> (4 * (k >> 1))) & 0x0f0f0f0fu) | (((hi >> (2 * k)) & 0x03030303u) << 4);
  }
  template <bool kAligned = false>
  __device__ __forceinline__ static uint32_t scale_word(const uint8_t* blk, int k) {
    return scale_of(word_at<kAligned>(blk + 96 + 4 * (k & 1)), word_at<kAligned>(blk + 104), k);
  }
  // A row's block (GgufBlockView or Q3KTileView).
  template <class View>
  __device__ __forceinline__ Q3KRow(const View& v, int t) {
    const uint32_t lo0 = v.word(96), lo1 = v.word(100), hi = v.word(104);
#pragma unroll
    for (int k = 0; k < 4; ++k) u[k] = scale_of(k & 1 ? lo1 : lo0, hi, k);
#pragma unroll
    for (int n = 0; n < 2; ++n) q[n][0] = v.word(32 + 32 * n + 8 * t), q[n][1] = v.word(36 + 32 * n + 8 * t);
    h[0] = v.word(8 * t), h[1] = v.word(8 * t + 4);
    d = __half2float(__ushort_as_half(v.half(108)));
  }
  __device__ __forceinline__ int scale(int s) const { return byte_of(u[s / 4], s % 4); }
  // Four codes, bytewise, of 128-column half n and bit pair j, from their qs word and hmask word.
  __device__ __forceinline__ static uint32_t codes_of(uint32_t qs, uint32_t hm, int n, int j) {
    return ((qs >> (2 * j)) & 0x03030303u) | (((hm >> (4 * n + j)) & 0x01010101u) << 2);
  }
  __device__ __forceinline__ uint32_t codes(int n, int j, int w) const { return codes_of(q[n][w], h[w], n, j); }
  uint32_t u[4], q[2][2], h[2];
  float d;
};

// A Q6_K block (210 bytes, 2-byte aligned: ql[128], qh[64], 16 signed 8-bit scales, d) as lane t
// reads it. Column 128n + 32j + l has code q = (nibble j / 2 of ql[64n + 32 (j % 2) + l]) | (bits
// 2j, 2j + 1 of qh[32n + l]) << 4 in sub-block s = 8n + 2j + l / 16, value d sc_s (q - 32). Lane
// t takes l = 16h + 4t .. 4t + 3 (k = 4t.. of sub-block 8n + 2j + h's mma.m16n8k16): ql word
// (n, h, i) (j = i, i + 2) and qh word (n, h); every word is loaded before any is used.
struct Q6KRow {
  // From the GGUF order (kAligned: word loads, else half-word pairs).
  template <bool kAligned>
  __device__ __forceinline__ static Q6KRow load(const uint8_t* blk, int t) {
    Q6KRow r;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int l = 16 * h + 4 * t;
        r.ql[n][h][0] = Q3KRow::word_at<kAligned>(blk + 64 * n + l);
        r.ql[n][h][1] = Q3KRow::word_at<kAligned>(blk + 64 * n + 32 + l);
        r.qh[n][h] = Q3KRow::word_at<kAligned>(blk + 128 + 32 * n + l);
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) r.sc[k] = Q3KRow::word_at<kAligned>(blk + 192 + 4 * k);
    r.d = __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(blk + 208)));
    return r;
  }
  // Rows g (a) and g + 8 (b) from a (tile, block) (tiles.h): nine 16-byte-or-less loads a lane
  // for both, the same words as load().
  __device__ __forceinline__ static void from_tile(const uint8_t* tile, int g, int t, Q6KRow& a, Q6KRow& b) {
    const int lane = 4 * g + t;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 c = *reinterpret_cast<const uint4*>(tile + 512 * (2 * n + h) + 16 * lane);
        a.ql[n][h][0] = c.x, b.ql[n][h][0] = c.y, a.ql[n][h][1] = c.z, b.ql[n][h][1] = c.w;
      }
      const uint4 c = *reinterpret_cast<const uint4*>(tile + 2048 + 512 * n + 16 * lane);
      a.qh[n][0] = c.x, b.qh[n][0] = c.y, a.qh[n][1] = c.z, b.qh[n][1] = c.w;
    }
    const uint4 sa = *reinterpret_cast<const uint4*>(tile + 3072 + 32 * g);
    const uint4 sb = *reinterpret_cast<const uint4*>(tile + 3072 + 32 * g + 16);
    a.sc[0] = sa.x, a.sc[1] = sa.y, a.sc[2] = sa.z, a.sc[3] = sa.w;
    b.sc[0] = sb.x, b.sc[1] = sb.y, b.sc[2] = sb.z, b.sc[3] = sb.w;
    const uint32_t dd = *reinterpret_cast<const uint32_t*>(tile + 3328 + 4 * g);
    a.d = half_lo(dd), b.d = half_hi(dd);
  }
  // The A operand of sub-block 8n + 2j + h: the codes minus 32, bytewise.
  __device__ __forceinline__ uint32_t codes(int n, int h, int j) const {
    const uint32_t lo = (ql[n][h][j & 1] >> (4 * (j >> 1))) & 0x0f0f0f0fu;
    return __vsub4(lo | (((qh[n][h] >> (2 * j)) & 0x03030303u) << 4), 0x20202020u);
  }
  __device__ __forceinline__ int scale(int s) const { return static_cast<int>(static_cast<int8_t>(byte_of(sc[s / 4], s % 4))); }
  uint32_t ql[2][2][2], qh[2][2], sc[4];
  float d;
};

}  // namespace dsflash::kernels::mma
