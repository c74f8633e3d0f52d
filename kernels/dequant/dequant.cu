// GGML block dequantisation on the GPU: one thread per output value, grid-stride.
// Layout conventions are those of common/quant/decode.cc (spec/model-v41.md §4.3); every
// product and difference is explicitly rounded (__fmul_rn/__fsub_rn, no FMA contraction)
// in the same order as the CPU reference, so results are bit-identical to it.
// Not the decode hot path (fused GEMV kernels read blocks directly); used to materialise
// weights and as the ground truth those kernels are tested against on the device.
#include <cuda_fp16.h>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/dequant/dequant.h"

namespace dsflash::kernels::dequant {
namespace {

using quant::GgmlType;

constexpr int kThreads = 256;

static __device__ __forceinline__ float half_at(const uint8_t* p) {
  const unsigned short h = static_cast<unsigned short>(p[0] | (p[1] << 8));
  return __half2float(__ushort_as_half(h));
}

static __device__ __forceinline__ void scale_min_k4(int k, const uint8_t* s, int* sc, int* m) {
  if (k < 4) {
    *sc = s[k] & 63;
    *m = s[k + 4] & 63;
  } else {
    *sc = (s[k + 4] & 0xf) | ((s[k - 4] >> 6) << 4);
    *m = (s[k + 4] >> 4) | ((s[k] >> 6) << 4);
  }
}

// Value e (0..255) of a Q2_K block b: scales[16] | qs[64] | d | dmin.
static __device__ float q2_k(const uint8_t* b, int e) {
  const int n = e / 128, r = e % 128, j = r / 32, l = r % 32;
  const int sc = b[8 * n + 2 * j + l / 16];
  const int q = (b[16 + 32 * n + l] >> (2 * j)) & 3;
  const float dl = __fmul_rn(half_at(b + 80), static_cast<float>(sc & 0xf));
  const float ml = __fmul_rn(half_at(b + 82), static_cast<float>(sc >> 4));
  return __fsub_rn(__fmul_rn(dl, static_cast<float>(q)), ml);
}

// Q3_K: hmask[32] | qs[64] | scales[12] | d.
static __device__ float q3_k(const uint8_t* b, int e) {
  const int n = e / 128, r = e % 128, j = r / 32, l = r % 32;
  const int s = 8 * n + 2 * j + l / 16;
  const uint8_t* sc = b + 96;
  const int lo4 = s < 8 ? (sc[s] & 0xf) : (sc[s - 8] >> 4);
  const int hi2 = (sc[8 + (s % 4)] >> (2 * (s / 4))) & 3;
  const int scale = (lo4 | (hi2 << 4)) - 32;
  const int q = ((b[32 + 32 * n + l] >> (2 * j)) & 3) - (((b[l] >> (4 * n + j)) & 1) ? 0 : 4);
  return __fmul_rn(__fmul_rn(half_at(b + 108), static_cast<float>(scale)), static_cast<float>(q));
}

// Q4_K: d | dmin | scales[12] | qs[128]; Q5_K adds qh[32] before qs.
template <bool kHigh>
static __device__ float q45_k(const uint8_t* b, int e) {
  const int c = e / 64, hi = (e % 64) / 32, l = e % 32;
  int sc, m;
  scale_min_k4(2 * c + hi, b + 4, &sc, &m);
  const uint8_t* qs = b + (kHigh ? 48 : 16);
  int q = hi ? (qs[32 * c + l] >> 4) : (qs[32 * c + l] & 0xf);
  if (kHigh && ((b[16 + l] >> (2 * c + hi)) & 1)) q += 16;
  const float d1 = __fmul_rn(half_at(b), static_cast<float>(sc));
  const float m1 = __fmul_rn(half_at(b + 2), static_cast<float>(m));
  return __fsub_rn(__fmul_rn(d1, static_cast<float>(q)), m1);
}

// Q6_K: ql[128] | qh[64] | scales[16] | d.
static __device__ float q6_k(const uint8_t* b, int e) {
  const int n = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
  const uint8_t ql = b[64 * n + l + ((quarter & 1) ? 32 : 0)];
  const int lo = (quarter & 2) ? (ql >> 4) : (ql & 0xf);
  const int hi = (b[128 + 32 * n + l] >> (2 * quarter)) & 3;
  const int sc = static_cast<int8_t>(b[192 + 8 * n + l / 16 + 2 * quarter]);
  return __fmul_rn(__fmul_rn(half_at(b + 208), static_cast<float>(sc)), static_cast<float>((lo | (hi << 4)) - 32));
}

static __device__ float q8_0(const uint8_t* b, int e) {
  return __fmul_rn(half_at(b), static_cast<float>(static_cast<int8_t>(b[2 + e])));
}

// Doubled E2M1 values, in constant memory (a local array would spill to local memory).
static __constant__ int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static __device__ float mxfp4(const uint8_t* b, int e) {  const uint32_t x = b[0];
  const float scale = __uint_as_float(x < 2 ? (0x00200000u << x) : ((x - 1) << 23));
  const uint8_t q = b[1 + (e % 16)];
  return __fmul_rn(static_cast<float>(kMxfp4Values[e < 16 ? (q & 0xf) : (q >> 4)]), scale);
}

template <GgmlType kType>
__global__ void __launch_bounds__(kThreads) dequant_kernel(const uint8_t* __restrict__ src, float* __restrict__ dst,
                                                           int64_t n, int block_elems, int block_bytes) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint8_t* b = src + (i / block_elems) * block_bytes;
    const int e = static_cast<int>(i % block_elems);
    float y;
    if constexpr (kType == GgmlType::kF32) y = reinterpret_cast<const float*>(src)[i];
    else if constexpr (kType == GgmlType::kF16) y = half_at(src + 2 * i);
    else if constexpr (kType == GgmlType::kBF16) y = __uint_as_float(static_cast<uint32_t>(src[2 * i] | (src[2 * i + 1] << 8)) << 16);
    else if constexpr (kType == GgmlType::kQ8_0) y = q8_0(b, e);
    else if constexpr (kType == GgmlType::kQ2_K) y = q2_k(b, e);
    else if constexpr (kType == GgmlType::kQ3_K) y = q3_k(b, e);
    else if constexpr (kType == GgmlType::kQ4_K) y = q45_k<false>(b, e);
    else if constexpr (kType == GgmlType::kQ5_K) y = q45_k<true>(b, e);
    else if constexpr (kType == GgmlType::kQ6_K) y = q6_k(b, e);
    else y = mxfp4(b, e);
    dst[i] = y;
  }
}

template <GgmlType kType>
Status launch_type(const ExecCtx& ctx, const void* src, float* dst, int64_t n) {
  const quant::TypeTraits& t = quant::traits(kType);
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65535LL * 8);
  return cuda::launch(dequant_kernel<kType>,
                      cuda::LaunchParams{dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
                                         static_cast<cudaStream_t>(ctx.cuda_stream)},
                      static_cast<const uint8_t*>(src), dst, n, static_cast<int>(t.block_elems),
                      static_cast<int>(t.block_bytes));
}

}  // namespace

bool cuda_supports(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: case GgmlType::kF16: case GgmlType::kBF16: case GgmlType::kQ8_0: case GgmlType::kQ2_K:
    case GgmlType::kQ3_K: case GgmlType::kQ4_K: case GgmlType::kQ5_K: case GgmlType::kQ6_K: case GgmlType::kMXFP4:
      return true;
    default:
      return false;
  }
}

Status dequantize_cuda(const ExecCtx& ctx, GgmlType type, const void* src, float* dst, int64_t n) {
  const quant::TypeTraits& t = quant::traits(type);
  if (n < 0 || n % t.block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("dequantize %s: %d is not a whole number of blocks", t.name, n));
  }
  switch (type) {
    case GgmlType::kF32: return launch_type<GgmlType::kF32>(ctx, src, dst, n);
    case GgmlType::kF16: return launch_type<GgmlType::kF16>(ctx, src, dst, n);
    case GgmlType::kBF16: return launch_type<GgmlType::kBF16>(ctx, src, dst, n);
    case GgmlType::kQ8_0: return launch_type<GgmlType::kQ8_0>(ctx, src, dst, n);
    case GgmlType::kQ2_K: return launch_type<GgmlType::kQ2_K>(ctx, src, dst, n);
    case GgmlType::kQ3_K: return launch_type<GgmlType::kQ3_K>(ctx, src, dst, n);
    case GgmlType::kQ4_K: return launch_type<GgmlType::kQ4_K>(ctx, src, dst, n);
    case GgmlType::kQ5_K: return launch_type<GgmlType::kQ5_K>(ctx, src, dst, n);
    case GgmlType::kQ6_K: return launch_type<GgmlType::kQ6_K>(ctx, src, dst, n);
    case GgmlType::kMXFP4: return launch_type<GgmlType::kMXFP4>(ctx, src, dst, n);
    default: return absl::UnimplementedError(absl::StrCat("no CUDA dequantiser for GGML type ", t.name));
  }
}

}  // namespace dsflash::kernels::dequant
