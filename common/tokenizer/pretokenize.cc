// The DeepSeek-V3 pre-tokenizer (llama.cpp DEEPSEEK3_LLM; spec/model-v41.md §5), written as
// hand matchers over code points instead of a regex engine. Three regexes are applied in
// sequence; each splits every piece from the previous step into its matches and the gaps
// between them ("Isolated" behaviour), so pieces always concatenate back to the input.
//   1. \p{N}{1,3}
//   2. [一-龥぀-ゟ゠-ヿ]+
//   3. [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
//      | ?[\p{P}\p{S}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
#include <functional>

#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/unicode.h"

namespace dsflash::tok {
namespace {

using uni::Char;
// A matcher returns the length in characters of the match starting at i (0: no match).
using Matcher = std::function<size_t(const std::vector<Char>&, size_t)>;

bool is_ascii_punct(int32_t c) {
  return (c >= 0x21 && c <= 0x2f) || (c >= 0x3a && c <= 0x40) || (c >= 0x5b && c <= 0x60) || (c >= 0x7b && c <= 0x7e);
}
bool is_ascii_letter(int32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_crlf(int32_t c) { return c == '\r' || c == '\n'; }
bool is_cjk(int32_t c) {
  return (c >= 0x4e00 && c <= 0x9fa5) || (c >= 0x3040 && c <= 0x309f) || (c >= 0x30a0 && c <= 0x30ff);
}
bool is_letter_or_mark(int32_t c) { return uni::is_letter(c) || uni::is_mark(c); }
bool is_punct_or_symbol(int32_t c) { return uni::is_punct(c) || uni::is_symbol(c); }

size_t match_digits(const std::vector<Char>& s, size_t i) {
  size_t n = 0;
  while (n < 3 && i + n < s.size() && uni::is_number(s[i + n].cp)) ++n;
  return n;
}

size_t match_cjk(const std::vector<Char>& s, size_t i) {
  size_t n = 0;
  while (i + n < s.size() && is_cjk(s[i + n].cp)) ++n;
  return n;
}

size_t run(const std::vector<Char>& s, size_t i, bool (*pred)(int32_t)) {
  size_t j = i;
  while (j < s.size() && pred(s[j].cp)) ++j;
  return j - i;
}

size_t match_main(const std::vector<Char>& s, size_t i) {
  const size_t n = s.size();
  const int32_t c = s[i].cp;
  // [ascii punct][A-Za-z]+
  if (is_ascii_punct(c) && i + 1 < n && is_ascii_letter(s[i + 1].cp)) {
    return 1 + run(s, i + 1, is_ascii_letter);
  }
  // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
  const bool opt_ok = c >= 0 ? !is_crlf(c) && !uni::is_letter(c) && !is_punct_or_symbol(c) : true;
  if (opt_ok && i + 1 < n && is_letter_or_mark(s[i + 1].cp)) return 1 + run(s, i + 1, is_letter_or_mark);
  if (is_letter_or_mark(c)) return run(s, i, is_letter_or_mark);
  // " ?[\p{P}\p{S}]+[\r\n]*"
  if (c == ' ' && i + 1 < n && is_punct_or_symbol(s[i + 1].cp)) {
    const size_t k = 1 + run(s, i + 1, is_punct_or_symbol);
    return k + run(s, i + k, is_crlf);
  }
  if (is_punct_or_symbol(c)) {
    const size_t k = run(s, i, is_punct_or_symbol);
    return k + run(s, i + k, is_crlf);
  }
  // Whitespace alternatives over the maximal whitespace run [i, i + ws).
  const size_t ws = run(s, i, uni::is_whitespace);
  if (ws == 0) return 0;
  // \s*[\r\n]+ : up to and including the last \r or \n of the run.
  for (size_t k = ws; k > 0; --k) {
    if (is_crlf(s[i + k - 1].cp)) return k;
  }
  // \s+(?!\S) : the whole run at the end of the piece, else all but its last character.
  if (i + ws == n) return ws;
  if (ws > 1) return ws - 1;
  return ws;  // \s+
}

// Splits every piece by `m`, keeping matches and gaps.
std::vector<std::string_view> split(const std::vector<std::string_view>& pieces, const Matcher& m) {
  std::vector<std::string_view> out;
  for (std::string_view piece : pieces) {
    const std::vector<Char> s = uni::decode_utf8(piece);
    size_t gap_start = 0, i = 0;
    auto byte_at = [&](size_t k) { return k < s.size() ? s[k].offset : piece.size(); };
    while (i < s.size()) {
      const size_t len = m(s, i);
      if (len == 0) {
        ++i;
        continue;
      }
      if (gap_start < i) out.push_back(piece.substr(byte_at(gap_start), byte_at(i) - byte_at(gap_start)));
      out.push_back(piece.substr(byte_at(i), byte_at(i + len) - byte_at(i)));
      i += len;
      gap_start = i;
    }
    if (gap_start < s.size()) out.push_back(piece.substr(byte_at(gap_start)));
  }
  return out;
}

}  // namespace

std::vector<std::string_view> pretokenize(std::string_view text) {
  if (text.empty()) return {};
  std::vector<std::string_view> pieces = {text};
  pieces = split(pieces, match_digits);
  pieces = split(pieces, match_cjk);
  pieces = split(pieces, match_main);
  return pieces;
}

}  // namespace dsflash::tok
