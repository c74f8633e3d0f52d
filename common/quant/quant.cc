// Type table and row-level dispatch for the GGML codecs. Block codecs live in
// decode.cc and encode.cc.
#include "common/quant/quant.h"

#include <array>
#include <cstring>
#include <string>

#include "absl/strings/ascii.h"

namespace dsflash::quant {
namespace {

using T = GgmlType;
constexpr std::array<TypeTraits, 32> kTraits = {{
    {T::kF32, "f32", 1, 4, true, true},
    {T::kF16, "f16", 1, 2, true, true},
    {T::kQ4_0, "q4_0", 32, 18, false, false},
    {T::kQ4_1, "q4_1", 32, 20, false, false},
    {T::kQ5_0, "q5_0", 32, 22, false, false},
    {T::kQ5_1, "q5_1", 32, 24, false, false},
    {T::kQ8_0, "q8_0", 32, 34, true, true},
    {T::kQ8_1, "q8_1", 32, 36, false, false},
    {T::kQ2_K, "q2_K", 256, 84, true, true},
    {T::kQ3_K, "q3_K", 256, 110, true, true},
    {T::kQ4_K, "q4_K", 256, 144, true, true},
    {T::kQ5_K, "q5_K", 256, 176, true, false},
    {T::kQ6_K, "q6_K", 256, 210, true, true},
    {T::kQ8_K, "q8_K", 256, 292, false, false},
    {T::kIQ2_XXS, "iq2_xxs", 256, 66, false, false},
    {T::kIQ2_XS, "iq2_xs", 256, 74, false, false},
    {T::kIQ3_XXS, "iq3_xxs", 256, 98, false, false},
    {T::kIQ1_S, "iq1_s", 256, 50, false, false},
    {T::kIQ4_NL, "iq4_nl", 32, 18, false, false},
    {T::kIQ3_S, "iq3_s", 256, 110, false, false},
    {T::kIQ2_S, "iq2_s", 256, 82, false, false},
    {T::kIQ4_XS, "iq4_xs", 256, 136, false, false},
    {T::kI8, "i8", 1, 1, false, false},
    {T::kI16, "i16", 1, 2, false, false},
    {T::kI32, "i32", 1, 4, false, false},
    {T::kI64, "i64", 1, 8, false, false},
    {T::kF64, "f64", 1, 8, false, false},
    {T::kIQ1_M, "iq1_m", 256, 56, false, false},
    {T::kBF16, "bf16", 1, 2, true, true},
    {T::kTQ1_0, "tq1_0", 256, 54, false, false},
    {T::kTQ2_0, "tq2_0", 256, 66, false, false},
    {T::kMXFP4, "mxfp4", 32, 17, true, true},
}};

}  // namespace

const TypeTraits* type_traits(uint32_t type_id) {
  for (const TypeTraits& t : kTraits) {
    if (static_cast<uint32_t>(t.type) == type_id) return &t;
  }
  return nullptr;
}

const TypeTraits& traits(GgmlType type) { return *type_traits(static_cast<uint32_t>(type)); }

std::string type_name(uint32_t type_id) {
  const TypeTraits* t = type_traits(type_id);
  return t ? std::string(t->name) : "type#" + std::to_string(type_id);
}

StatusOr<GgmlType> type_from_name(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(std::string(name));
  for (const TypeTraits& t : kTraits) {
    if (absl::AsciiStrToLower(t.name) == lower) return t.type;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown GGML type name '", std::string(name), "'"));
}

StatusOr<uint64_t> row_bytes(GgmlType type, uint64_t n_elems) {
  const TypeTraits& t = traits(type);
  if (n_elems % t.block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d elements are not a whole number of %s blocks (%d elements each)", n_elems, t.name,
        t.block_elems));
  }
  const uint64_t blocks = n_elems / t.block_elems;
  if (blocks > UINT64_MAX / t.block_bytes) {
    return absl::OutOfRangeError(absl::StrFormat("%d %s elements overflow a byte count", n_elems, t.name));
  }
  return blocks * t.block_bytes;
}

Status decode_row(GgmlType type, const void* src, float* dst, int64_t n) {
  const TypeTraits& t = traits(type);
  if (!t.can_decode) return absl::UnimplementedError(absl::StrCat("no decoder for GGML type ", t.name));
  if (n < 0 || n % t.block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("decode %s: %d is not a whole number of blocks", t.name, n));
  }
  const auto* b = static_cast<const uint8_t*>(src);
  const int64_t nb = n / t.block_elems;
  switch (type) {
    case T::kF32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return absl::OkStatus();
    case T::kF16:
      for (int64_t i = 0; i < n; ++i) { uint16_t h; std::memcpy(&h, b + 2 * i, 2); dst[i] = f16_to_f32(h); }
      return absl::OkStatus();
    case T::kBF16:
      for (int64_t i = 0; i < n; ++i) { uint16_t h; std::memcpy(&h, b + 2 * i, 2); dst[i] = bf16_to_f32(h); }
      return absl::OkStatus();
    default: break;
  }
  void (*fn)(const uint8_t*, float*) = nullptr;
  switch (type) {
    case T::kQ8_0: fn = block::decode_q8_0; break;
    case T::kQ2_K: fn = block::decode_q2_k; break;
    case T::kQ3_K: fn = block::decode_q3_k; break;
    case T::kQ4_K: fn = block::decode_q4_k; break;
    case T::kQ5_K: fn = block::decode_q5_k; break;
    case T::kQ6_K: fn = block::decode_q6_k; break;
    case T::kMXFP4: fn = block::decode_mxfp4; break;
    default: return absl::UnimplementedError(absl::StrCat("no decoder for GGML type ", t.name));
  }
  for (int64_t i = 0; i < nb; ++i) fn(b + i * t.block_bytes, dst + i * t.block_elems);
  return absl::OkStatus();
}

Status encode_row(GgmlType type, const float* src, void* dst, int64_t n) {
  const TypeTraits& t = traits(type);
  if (!t.can_encode) return absl::UnimplementedError(absl::StrCat("no encoder for GGML type ", t.name));
  if (n < 0 || n % t.block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("encode %s: %d is not a whole number of blocks", t.name, n));
  }
  auto* b = static_cast<uint8_t*>(dst);
  const int64_t nb = n / t.block_elems;
  switch (type) {
    case T::kF32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return absl::OkStatus();
    case T::kF16:
      for (int64_t i = 0; i < n; ++i) { const uint16_t h = f32_to_f16(src[i]); std::memcpy(b + 2 * i, &h, 2); }
      return absl::OkStatus();
    case T::kBF16:
      for (int64_t i = 0; i < n; ++i) { const uint16_t h = f32_to_bf16(src[i]); std::memcpy(b + 2 * i, &h, 2); }
      return absl::OkStatus();
    default: break;
  }
  void (*fn)(const float*, uint8_t*) = nullptr;
  switch (type) {
    case T::kQ8_0: fn = block::encode_q8_0; break;
    case T::kQ2_K: fn = block::encode_q2_k; break;
    case T::kQ3_K: fn = block::encode_q3_k; break;
    case T::kQ4_K: fn = block::encode_q4_k; break;
    case T::kQ6_K: fn = block::encode_q6_k; break;
    case T::kMXFP4: fn = block::encode_mxfp4; break;
    default: return absl::UnimplementedError(absl::StrCat("no encoder for GGML type ", t.name));
  }
  for (int64_t i = 0; i < nb; ++i) fn(src + i * t.block_elems, b + i * t.block_bytes);
  return absl::OkStatus();
}

}  // namespace dsflash::quant
