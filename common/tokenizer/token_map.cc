// The Engram compressed token map (spec/model-v41.md §3.1), built with ICU normalisers.
// Real model files carry the map (deepseek41.engram.token_map); this builder is what the
// synthetic-model writer uses to produce one the same way the official code does.
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/tokenizer.h"

namespace dsflash::tok {
namespace {

bool contains_replacement(const std::string& s) { return s.find("\xEF\xBF\xBD") != std::string::npos; }

// NFKC -> NFD -> strip marks -> lowercase -> collapse [ \t\r\n]+ -> lone space kept -> strip.
StatusOr<std::string> normalise(const std::string& text) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* nfkc = icu::Normalizer2::getNFKCInstance(err);
  const icu::Normalizer2* nfd = icu::Normalizer2::getNFDInstance(err);
  if (U_FAILURE(err)) return absl::InternalError(absl::StrCat("ICU normalisers unavailable: ", u_errorName(err)));
  icu::UnicodeString s = nfkc->normalize(icu::UnicodeString::fromUTF8(text), err);
  s = nfd->normalize(s, err);
  if (U_FAILURE(err)) return absl::InternalError(absl::StrCat("ICU normalisation failed: ", u_errorName(err)));
  icu::UnicodeString stripped;
  for (int32_t i = 0; i < s.length();) {
    const UChar32 c = s.char32At(i);
    if (u_charType(c) != U_NON_SPACING_MARK) stripped.append(c);
    i += U16_LENGTH(c);
  }
  stripped.toLower();
  std::string lower;
  stripped.toUTF8String(lower);
  std::string collapsed;
  for (size_t i = 0; i < lower.size();) {
    const char c = lower[i];
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
      collapsed.push_back(' ');
      while (i < lower.size() && (lower[i] == ' ' || lower[i] == '\t' || lower[i] == '\r' || lower[i] == '\n')) ++i;
    } else {
      collapsed.push_back(c);
      ++i;
    }
  }
  if (collapsed == " ") return collapsed;
  const size_t b = collapsed.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return std::string();
  const size_t e = collapsed.find_last_not_of(" \t\r\n");
  return collapsed.substr(b, e - b + 1);
}

}  // namespace

StatusOr<std::vector<int32_t>> build_compressed_token_map(const Tokenizer& t) {
  std::map<std::string, int32_t> ids;
  std::vector<int32_t> out(static_cast<size_t>(t.n_vocab()));
  for (int32_t id = 0; id < t.n_vocab(); ++id) {
    ASSIGN_OR_RETURN(std::string bytes, t.token_bytes(id));
    // Decoding a partial UTF-8 token gives U+FFFD: such tokens are keyed by their raw string.
    icu::UnicodeString u = icu::UnicodeString::fromUTF8(bytes);
    std::string decoded;
    u.toUTF8String(decoded);
    std::string key;
    if (contains_replacement(decoded)) {
      key = t.token_text(id);
    } else {
      ASSIGN_OR_RETURN(key, normalise(decoded));
      if (key.empty()) key = decoded;
    }
    const auto [it, inserted] = ids.emplace(key, static_cast<int32_t>(ids.size()));
    out[id] = it->second;
  }
  return out;
}

}  // namespace dsflash::tok
