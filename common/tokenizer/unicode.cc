// UTF-8 decoding and Unicode general categories through ICU (u_charType).
#include "common/tokenizer/unicode.h"

#include <unicode/uchar.h>

namespace dsflash::tok::uni {

std::vector<Char> decode_utf8(std::string_view s) {
  std::vector<Char> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const uint32_t n = static_cast<uint32_t>(s.size());
  for (uint32_t i = 0; i < n;) {
    const uint8_t c = p[i];
    uint32_t len = 0;
    int32_t cp = 0;
    if (c < 0x80) { len = 1; cp = c; }
    else if ((c & 0xe0) == 0xc0) { len = 2; cp = c & 0x1f; }
    else if ((c & 0xf0) == 0xe0) { len = 3; cp = c & 0x0f; }
    else if ((c & 0xf8) == 0xf0) { len = 4; cp = c & 0x07; }
    bool ok = len > 0 && i + len <= n;
    for (uint32_t k = 1; ok && k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) ok = false;
      else cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    // Reject overlong forms, surrogates and values above U+10FFFF.
    if (ok && ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
               (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)) {
      ok = false;
    }
    if (!ok) {
      out.push_back({-1, i, 1});
      ++i;
      continue;
    }
    out.push_back({cp, i, len});
    i += len;
  }
  return out;
}

void append_utf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

namespace {
inline uint32_t mask(int32_t cp) { return cp < 0 ? 0 : U_MASK(u_charType(cp)); }
}  // namespace

bool is_letter(int32_t cp) { return mask(cp) & U_GC_L_MASK; }
bool is_mark(int32_t cp) { return mask(cp) & U_GC_M_MASK; }
bool is_number(int32_t cp) { return mask(cp) & U_GC_N_MASK; }
bool is_punct(int32_t cp) { return mask(cp) & U_GC_P_MASK; }
bool is_symbol(int32_t cp) { return mask(cp) & U_GC_S_MASK; }
bool is_whitespace(int32_t cp) { return cp >= 0 && u_isUWhiteSpace(cp); }

}  // namespace dsflash::tok::uni
