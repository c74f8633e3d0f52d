// GGML tensor types: block geometry of every type a GGUF file may name, exact decoders
// (GGML semantics, spec/model-v41.md §4.3) for the types dsflash runs, and encoders for the
// types the synthetic-model writer emits. Decoders are the reference the CUDA kernels are
// tested against. Thread-safe: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/quant/numeric.h"
#include "common/status.h"

namespace dsflash::quant {

// GGML type ids as stored in GGUF tensor infos.
enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15,
  kIQ2_XXS = 16, kIQ2_XS = 17, kIQ3_XXS = 18, kIQ1_S = 19, kIQ4_NL = 20, kIQ3_S = 21,
  kIQ2_S = 22, kIQ4_XS = 23, kI8 = 24, kI16 = 25, kI32 = 26, kI64 = 27, kF64 = 28,
  kIQ1_M = 29, kBF16 = 30, kTQ1_0 = 34, kTQ2_0 = 35, kMXFP4 = 39,
};

struct TypeTraits {
  GgmlType type;
  const char* name;        // GGML's name, e.g. "q2_K"
  uint32_t block_elems;    // elements per block
  uint32_t block_bytes;    // bytes per block
  bool can_decode;         // decode_row supports it
  bool can_encode;         // encode_row supports it
};

// Traits of a raw type id, or nullptr if the id is not a known GGML type.
const TypeTraits* type_traits(uint32_t type_id);
// Traits of a known type (never null).
const TypeTraits& traits(GgmlType type);
// GGML name of a type id ("q2_K"), or "type#N" for unknown ids.
std::string type_name(uint32_t type_id);
// Type from a GGML name (case-insensitive: "Q2_K", "bf16").
StatusOr<GgmlType> type_from_name(std::string_view name);

// Bytes of `n_elems` consecutive elements; InvalidArgument unless n_elems is a whole number
// of blocks; OutOfRange on overflow.
StatusOr<uint64_t> row_bytes(GgmlType type, uint64_t n_elems);

// Decodes n_elems values (a whole number of blocks) from `src` into `dst` (fp32).
// Unimplemented for types without a decoder.
Status decode_row(GgmlType type, const void* src, float* dst, int64_t n_elems);
// Encodes n_elems fp32 values (a whole number of blocks) into `dst`
// (row_bytes(type, n_elems) bytes). Unimplemented for types without an encoder.
Status encode_row(GgmlType type, const float* src, void* dst, int64_t n_elems);

// Per-format block codecs (one block each), exposed for tests and kernels' references.
namespace block {
inline constexpr int kQK = 256;  // K-quant super-block
void decode_q8_0(const uint8_t* b, float* y);
void decode_q2_k(const uint8_t* b, float* y);
void decode_q3_k(const uint8_t* b, float* y);
void decode_q4_k(const uint8_t* b, float* y);
void decode_q5_k(const uint8_t* b, float* y);
void decode_q6_k(const uint8_t* b, float* y);
void decode_mxfp4(const uint8_t* b, float* y);
void encode_q8_0(const float* x, uint8_t* b);
void encode_q2_k(const float* x, uint8_t* b);
void encode_q3_k(const float* x, uint8_t* b);
void encode_q4_k(const float* x, uint8_t* b);
void encode_q6_k(const float* x, uint8_t* b);
void encode_mxfp4(const float* x, uint8_t* b);
}  // namespace block

}  // namespace dsflash::quant
