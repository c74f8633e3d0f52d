// Quant codecs: scalar formats exhaustively, every block decoder on hand-computed blocks,
// and decode(encode(x)) error bounds on random data.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/quant/quant.h"
#include "gtest/gtest.h"

namespace dsflash::quant {
namespace {

void put_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

TEST(Numeric, F16RoundTripsEveryFiniteCode) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), h) << "code " << h;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
}

TEST(Numeric, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(bits_f32(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(f32_to_bf16(bits_f32(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(f32_to_bf16(bits_f32(0x3f808001u)), 0x3f81);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  EXPECT_EQ(round_bf16(-2.5f), -2.5f);
}

TEST(Numeric, E4m3EveryCodeAndSaturation) {
  for (int c = 0; c < 256; ++c) {
    const float f = e4m3_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(f)) {
      EXPECT_EQ(c & 0x7f, 0x7f);
      continue;
    }
    if (c == 0x80) continue;  // -0 encodes back as -0 (0x80): checked below
    EXPECT_EQ(f32_to_e4m3(f), c) << "code " << c;
  }
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(f32_to_e4m3(1000.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-1000.0f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);  // tie between 1.0 (even) and 1.125
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3a);  // tie between 1.125 and 1.25 (even)
}

TEST(Numeric, E8m0AndE2m1) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(130), 8.0f);
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
  const float mags[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(c)), (c & 8 ? -1 : 1) * mags[c & 7]);
    if (c != 8) {
      EXPECT_EQ(f32_to_e2m1(e2m1_to_f32(static_cast<uint8_t>(c))), c);
    }
  }
  // Ties go to the even code: up only at 0.75, 1.75 and 3.5.
  EXPECT_EQ(f32_to_e2m1(0.25f), 0);
  EXPECT_EQ(f32_to_e2m1(0.75f), 2);
  EXPECT_EQ(f32_to_e2m1(1.25f), 2);
  EXPECT_EQ(f32_to_e2m1(1.75f), 4);
  EXPECT_EQ(f32_to_e2m1(2.5f), 4);
  EXPECT_EQ(f32_to_e2m1(3.5f), 6);
  EXPECT_EQ(f32_to_e2m1(5.0f), 6);
  EXPECT_EQ(f32_to_e2m1(100.0f), 7);
  EXPECT_EQ(f32_to_e2m1(-100.0f), 15);
}

TEST(TypeTable, SizesMatchGgml) {
  EXPECT_EQ(traits(GgmlType::kQ2_K).block_bytes, 84u);
  EXPECT_EQ(traits(GgmlType::kQ3_K).block_bytes, 110u);
  EXPECT_EQ(traits(GgmlType::kQ4_K).block_bytes, 144u);
  EXPECT_EQ(traits(GgmlType::kQ5_K).block_bytes, 176u);
  EXPECT_EQ(traits(GgmlType::kQ6_K).block_bytes, 210u);
  EXPECT_EQ(traits(GgmlType::kQ8_0).block_bytes, 34u);
  EXPECT_EQ(traits(GgmlType::kMXFP4).block_bytes, 17u);
  EXPECT_EQ(type_traits(5), nullptr);  // removed Q4_2
  EXPECT_EQ(type_traits(1000), nullptr);
  EXPECT_EQ(*row_bytes(GgmlType::kQ2_K, 5120), 20u * 84u);
  EXPECT_FALSE(row_bytes(GgmlType::kQ2_K, 100).ok());
  EXPECT_EQ(*type_from_name("Q3_K"), GgmlType::kQ3_K);
  EXPECT_FALSE(type_from_name("q9_z").ok());
}

// ---- hand-computed blocks ------------------------------------------------------------------

TEST(Decode, Q8_0) {
  uint8_t b[34] = {};
  put_u16(b, 0x3800);  // d = 0.5
  b[2] = 4;
  b[3] = static_cast<uint8_t>(-3);
  b[33] = 127;
  float y[32];
  block::decode_q8_0(b, y);
  EXPECT_EQ(y[0], 2.0f);
  EXPECT_EQ(y[1], -1.5f);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_EQ(y[31], 63.5f);
}

TEST(Decode, Q2_K) {
  uint8_t b[84] = {};
  b[0] = 0x21;                   // sub-block 0: scale 1, min 2
  b[2] = 0x03;                   // sub-block 2: scale 3, min 0
  b[11] = 0x45;                  // sub-block 11: scale 5, min 4
  b[16] = 0b11100100;            // qs[0]: 2-bit fields 0,1,2,3 at shifts 0,2,4,6
  b[16 + 49] = 0b00001100;       // qs[49]: shift 2 -> 3
  put_u16(b + 80, 0x3c00);       // d = 1
  put_u16(b + 82, 0x3800);       // dmin = 0.5
  float y[256];
  block::decode_q2_k(b, y);
  EXPECT_EQ(y[0], -1.0f);        // sub 0: 1*0 - 0.5*2
  EXPECT_EQ(y[1], -1.0f);
  EXPECT_EQ(y[32], 3.0f);        // e=32: j=1 -> shift 2, q=1, sub 2
  EXPECT_EQ(y[177], 13.0f);      // e=177: n=1 j=1 l=17 -> qs[49] shift 2 = 3, sub 11: 5*3 - 0.5*4
}

TEST(Decode, Q3_K) {
  uint8_t b[110] = {};
  b[96 + 0] = 0x03;              // sub 0 lo4 = 3 (u = 35 -> scale 3)
  b[96 + 8] = 0x02;              // sub 0 hi2 = 2
  b[96 + 1] = 0xb0;              // sub 9 lo4 = 11 (u = 27 -> scale -5)
  b[96 + 9] = 0x10;              // sub 9 hi2 = 1 at bits 4..5
  b[32 + 0] = 0x01;              // e=0: low bits 1
  b[0] = 0x01;                   // hmask[0] bit 0 set: no -4
  b[32 + 48] = 0x03;             // e=144 (n=1 j=0 l=16): low bits 3
  b[16] = 0x10;                  // hmask[16] bit 4 set
  put_u16(b + 108, 0x3800);      // d = 0.5
  float y[256];
  block::decode_q3_k(b, y);
  EXPECT_EQ(y[0], 1.5f);         // 0.5*3*1
  EXPECT_EQ(y[1], -6.0f);        // 0.5*3*(0-4)
  EXPECT_EQ(y[144], -7.5f);      // 0.5*(-5)*3
  EXPECT_EQ(y[200], 0.5f * -32 * -4);  // untouched sub-blocks: scale -32, code -4
}

TEST(Decode, Q4_K) {
  uint8_t b[144] = {};
  put_u16(b, 0x3c00);            // d = 1
  put_u16(b + 2, 0x3400);        // dmin = 0.25
  b[4 + 0] = 5;                  // pair 0: scale 5
  b[4 + 4] = 2;                  //         min 2
  b[4 + 9] = 0x37;               // pair 5: scale lo 7, min lo 3
  b[4 + 1] = 0x40;               //         scale hi 1 -> 23
  b[4 + 5] = 0x80;               //         min hi 2 -> 35
  b[16 + 0] = 0x09;              // e=0: q 9
  b[16 + 67] = 0xa0;             // e=163 (chunk 2, high nibble, l=3): q 10
  float y[256];
  block::decode_q4_k(b, y);
  EXPECT_EQ(y[0], 44.5f);        // 5*9 - 0.25*2
  EXPECT_EQ(y[163], 221.25f);    // 23*10 - 0.25*35
}

TEST(Decode, Q5_K) {
  uint8_t b[176] = {};
  put_u16(b, 0x3c00);            // d = 1
  put_u16(b + 2, 0x3800);        // dmin = 0.5
  b[4] = 2; b[8] = 1;            // pair 0: scale 2, min 1
  b[5] = 3; b[9] = 0;            // pair 1: scale 3, min 0
  b[6] = 1; b[10] = 4;           // pair 2: scale 1, min 4
  b[48 + 0] = 0x03; b[16 + 0] = 0x01;   // e=0: 3 + 16
  b[48 + 1] = 0x50; b[16 + 1] = 0x02;   // e=33: 5 + 16
  b[48 + 34] = 0x07; b[16 + 2] = 0x04;  // e=66: 7 + 16
  float y[256];
  block::decode_q5_k(b, y);
  EXPECT_EQ(y[0], 37.5f);
  EXPECT_EQ(y[33], 63.0f);
  EXPECT_EQ(y[66], 21.0f);
}

TEST(Decode, Q6_K) {
  uint8_t b[210] = {};
  b[0] = 0x05; b[128] = 0x02;    // e=0: (5 | 2<<4) - 32 = 5
  b[1] = 0x30;                   // e=65: (3 | 0) - 32 = -29
  b[113] = 0x0f; b[128 + 49] = 0x0c;  // e=177: (15 | 3<<4) - 32 = 31
  b[192 + 0] = 2;
  b[192 + 4] = static_cast<uint8_t>(-3);
  b[192 + 11] = 4;
  put_u16(b + 208, 0x3800);      // d = 0.5
  float y[256];
  block::decode_q6_k(b, y);
  EXPECT_EQ(y[0], 5.0f);
  EXPECT_EQ(y[65], 43.5f);
  EXPECT_EQ(y[177], 62.0f);
}

TEST(Decode, Mxfp4) {
  uint8_t b[17] = {};
  b[0] = 128;                    // 2^(128-128) = 1
  b[1] = 0x97;                   // y0 = kv[7] = 12, y16 = kv[9] = -1
  float y[32];
  block::decode_mxfp4(b, y);
  EXPECT_EQ(y[0], 12.0f);
  EXPECT_EQ(y[16], -1.0f);
  b[0] = 126;                    // 2^-2
  b[2] = 0x5d;                   // y1 = kv[13] = -6, y17 = kv[5] = 6
  block::decode_mxfp4(b, y);
  EXPECT_EQ(y[1], -1.5f);
  EXPECT_EQ(y[17], 1.5f);
  b[0] = 0;                      // 2^-128, a subnormal fp32 scale
  block::decode_mxfp4(b, y);
  EXPECT_EQ(y[0], 12.0f * std::ldexp(1.0f, -128));
}

TEST(Decode, RowDispatchRejectsPartialBlocksAndUnknownDecoders) {
  std::vector<uint8_t> src(84);
  std::vector<float> dst(256);
  EXPECT_FALSE(decode_row(GgmlType::kQ2_K, src.data(), dst.data(), 100).ok());
  EXPECT_EQ(decode_row(GgmlType::kIQ2_XXS, src.data(), dst.data(), 256).code(), absl::StatusCode::kUnimplemented);
}

// ---- decode(encode(x)) ----------------------------------------------------------------------

struct Bound {
  GgmlType type;
  double max_rel_rmse;  // rms(decode(encode(x)) - x) / rms(x) over gaussian rows
};

class RoundTrip : public ::testing::TestWithParam<Bound> {};

TEST_P(RoundTrip, ErrorWithinBound) {
  const Bound bound = GetParam();
  std::mt19937 rng(1234 + static_cast<int>(bound.type));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int n = 256 * 16;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) x[i] = normal(rng) * (0.01f + 0.5f * static_cast<float>(i / 256));  // varied scales
  std::vector<uint8_t> bytes(*row_bytes(bound.type, n));
  ASSERT_TRUE(encode_row(bound.type, x.data(), bytes.data(), n).ok());
  ASSERT_TRUE(decode_row(bound.type, bytes.data(), y.data(), n).ok());
  // Per 256-value block so a good block cannot hide a bad one.
  for (int blk = 0; blk < n / 256; ++blk) {
    double se = 0, sx = 0;
    for (int i = 256 * blk; i < 256 * (blk + 1); ++i) {
      se += (y[i] - x[i]) * (y[i] - x[i]);
      sx += x[i] * x[i];
    }
    EXPECT_LE(std::sqrt(se / sx), bound.max_rel_rmse) << traits(bound.type).name << " block " << blk;
  }
  // Zeros encode to zeros.
  std::vector<float> z(n, 0.0f);
  ASSERT_TRUE(encode_row(bound.type, z.data(), bytes.data(), n).ok());
  ASSERT_TRUE(decode_row(bound.type, bytes.data(), y.data(), n).ok());
  for (float v : y) ASSERT_EQ(v, 0.0f);
}

INSTANTIATE_TEST_SUITE_P(AllEncoders, RoundTrip,
                         ::testing::Values(Bound{GgmlType::kF32, 0.0}, Bound{GgmlType::kF16, 5e-4},
                                           Bound{GgmlType::kBF16, 4e-3}, Bound{GgmlType::kQ8_0, 0.012},
                                           Bound{GgmlType::kQ6_K, 0.035}, Bound{GgmlType::kQ4_K, 0.13},
                                           Bound{GgmlType::kQ3_K, 0.30}, Bound{GgmlType::kQ2_K, 0.55},
                                           Bound{GgmlType::kMXFP4, 0.20}),
                         [](const auto& info) { return std::string(traits(info.param.type).name); });

TEST(Encode, Mxfp4IsExactOnRepresentableValues) {
  float x[32], y[32];
  const float mags[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int i = 0; i < 32; ++i) x[i] = (i % 2 ? -1 : 1) * mags[i % 8] * 0.125f;
  x[7] = 6 * 0.125f;  // amax sets the exponent exactly
  uint8_t b[17];
  block::encode_mxfp4(x, b);
  block::decode_mxfp4(b, y);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], x[i]) << i;
}

TEST(Encode, Q8_0MaxErrorIsHalfAStep) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  float x[32], y[32];
  for (float& v : x) v = u(rng);
  uint8_t b[34];
  block::encode_q8_0(x, b);
  block::decode_q8_0(b, y);
  uint16_t h;
  std::memcpy(&h, b, 2);
  const float d = f16_to_f32(h);
  for (int i = 0; i < 32; ++i) EXPECT_LE(std::fabs(y[i] - x[i]), 0.5f * d * 1.001f + 1e-6f);
}

}  // namespace
}  // namespace dsflash::quant
