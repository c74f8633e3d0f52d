// Internal: UTF-8 decoding and the Unicode character classes the pre-tokenizer needs (ICU).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsflash::tok::uni {

// One decoded character: code point (or -1 for an invalid byte) and its byte span.
struct Char {
  int32_t cp;
  uint32_t offset;
  uint32_t len;
};
std::vector<Char> decode_utf8(std::string_view s);
void append_utf8(std::string* out, uint32_t cp);

bool is_letter(int32_t cp);      // \p{L}
bool is_mark(int32_t cp);        // \p{M}
bool is_number(int32_t cp);      // \p{N}
bool is_punct(int32_t cp);       // \p{P}
bool is_symbol(int32_t cp);      // \p{S}
bool is_whitespace(int32_t cp);  // \s (Unicode White_Space)

}  // namespace dsflash::tok::uni
