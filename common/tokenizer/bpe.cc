// Byte-level BPE encode/decode (GPT-2 byte mapping, merge ranks), special-token matching
// before BPE, byte fallback, and the incremental detokeniser.
#include <algorithm>
#include <array>
#include <climits>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/unicode.h"

namespace dsflash::tok {
namespace {

// GPT-2's reversible byte -> code point map: printable Latin-1 bytes map to themselves, the
// other 68 bytes to U+0100 upwards in byte order.
struct ByteMap {
  std::array<uint32_t, 256> to_cp{};
  std::array<int, 512> to_byte{};
  ByteMap() {
    to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool keep = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
      to_cp[b] = keep ? static_cast<uint32_t>(b) : next++;
      to_byte[to_cp[b]] = b;
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

}  // namespace

std::string bytes_to_unicode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) uni::append_utf8(&out, byte_map().to_cp[b]);
  return out;
}

std::optional<std::string> unicode_to_bytes(std::string_view text) {
  std::string out;
  for (const uni::Char& c : uni::decode_utf8(text)) {
    if (c.cp < 0 || c.cp >= 512 || byte_map().to_byte[c.cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(byte_map().to_byte[c.cp]));
  }
  return out;
}

std::string valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const uni::Char& c : uni::decode_utf8(s)) {
    if (c.cp < 0) out += "\xEF\xBF\xBD";  // U+FFFD for a byte that is not part of a valid character
    else out.append(s.substr(c.offset, c.len));
  }
  return out;
}

size_t complete_utf8_prefix(std::string_view s) {
  // Look back at most 3 bytes for the lead byte of a trailing sequence.
  const size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xc0) == 0x80) continue;  // continuation byte
    size_t need = 1;
    if ((c & 0xe0) == 0xc0) need = 2;
    else if ((c & 0xf0) == 0xe0) need = 3;
    else if ((c & 0xf8) == 0xf0) need = 4;
    return back < need ? n - back : n;
  }
  return n;
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::create(Vocab vocab) {
  if (vocab.tokens.empty()) return absl::InvalidArgumentError("tokenizer vocabulary is empty");
  if (!vocab.types.empty() && vocab.types.size() != vocab.tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.token_type has ", vocab.types.size(), " entries for ",
                                                   vocab.tokens.size(), " tokens"));
  }
  const int32_t n = static_cast<int32_t>(vocab.tokens.size());
  for (int32_t id : {vocab.bos, vocab.eos, vocab.pad}) {
    if (id >= n) return absl::InvalidArgumentError(absl::StrCat("special token id ", id, " is outside the vocabulary (", n, ")"));
  }
  std::unique_ptr<Tokenizer> t(new Tokenizer(std::move(vocab)));
  for (int32_t i = 0; i < n; ++i) t->token_ids_.emplace(t->vocab_.tokens[i], i);  // first id wins on duplicates
  for (size_t r = 0; r < t->vocab_.merges.size(); ++r) {
    const std::string& m = t->vocab_.merges[r];
    if (m.find(' ') == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.merges[", r, "] = '", m, "' has no space separator"));
    }
    t->merge_rank_.emplace(m, static_cast<int32_t>(r));
  }
  for (int32_t i = 0; i < n; ++i) {
    const TokenType ty = t->token_type(i);
    if ((ty == TokenType::kControl || ty == TokenType::kUserDefined) && !t->vocab_.tokens[i].empty()) {
      t->specials_.push_back(i);
    }
  }
  std::sort(t->specials_.begin(), t->specials_.end(), [&](int32_t a, int32_t b) {
    return t->vocab_.tokens[a].size() > t->vocab_.tokens[b].size();
  });
  t->byte_token_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    const auto it = t->token_ids_.find(bytes_to_unicode(std::string(1, static_cast<char>(b))));
    if (it != t->token_ids_.end()) t->byte_token_[b] = it->second;
  }
  return t;
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const gguf::Model& m) {
  auto str_key = [&](const char* k) -> std::string {
    const gguf::Value* v = m.find(k);
    return v && v->as_string() ? *v->as_string() : "";
  };
  const std::string model = str_key("tokenizer.ggml.model");
  if (model != "gpt2") {
    return absl::InvalidArgumentError(absl::StrCat("'", m.path(), "': tokenizer.ggml.model is '", model,
                                                   "'; DeepSeek-V4.1 uses byte-level BPE ('gpt2')"));
  }
  Vocab v;
  v.pre = str_key("tokenizer.ggml.pre");
  if (!v.pre.empty() && v.pre != "deepseek-v3" && v.pre != "deepseek-v4" && v.pre != "deepseek-v41") {
    return absl::InvalidArgumentError(absl::StrCat("'", m.path(), "': pre-tokenizer '", v.pre,
                                                   "' is not the DeepSeek-V3 split this model needs"));
  }
  const gguf::Value* tokens = m.find("tokenizer.ggml.tokens");
  if (tokens == nullptr || !tokens->is_array() || tokens->elem_type() != gguf::ValueType::kString) {
    return absl::InvalidArgumentError(absl::StrCat("'", m.path(), "' lacks the string array tokenizer.ggml.tokens"));
  }
  v.tokens = tokens->strings();
  if (const gguf::Value* ty = m.find("tokenizer.ggml.token_type")) {
    ASSIGN_OR_RETURN(auto types, ty->ints());
    v.types.assign(types.begin(), types.end());
  }
  if (const gguf::Value* mg = m.find("tokenizer.ggml.merges")) {
    if (mg->size() > 0 && mg->elem_type() != gguf::ValueType::kString) {
      return absl::InvalidArgumentError("tokenizer.ggml.merges is not a string array");
    }
    v.merges = mg->strings();
  }
  auto id_key = [&](const char* k) -> int32_t {
    const gguf::Value* val = m.find(k);
    const auto u = val ? val->as_u64() : std::nullopt;
    return u && *u < static_cast<uint64_t>(INT32_MAX) ? static_cast<int32_t>(*u) : -1;
  };
  v.bos = id_key("tokenizer.ggml.bos_token_id");
  v.eos = id_key("tokenizer.ggml.eos_token_id");
  v.pad = id_key("tokenizer.ggml.padding_token_id");
  if (const gguf::Value* ab = m.find("tokenizer.ggml.add_bos_token")) v.add_bos = ab->as_bool().value_or(false);
  auto t = create(std::move(v));
  if (!t.ok()) return Status(t.status().code(), absl::StrCat("'", m.path(), "': ", t.status().message()));
  return t;
}

TokenType Tokenizer::token_type(int32_t id) const {
  if (vocab_.types.empty()) return TokenType::kNormal;
  return static_cast<TokenType>(vocab_.types[id]);
}

std::optional<int32_t> Tokenizer::find(std::string_view text) const {
  const auto it = token_ids_.find(std::string(text));
  if (it == token_ids_.end()) return std::nullopt;
  return it->second;
}

void Tokenizer::bpe_piece(std::string_view piece, std::vector<int32_t>* out, Status* status) const {
  const std::string mapped = bytes_to_unicode(piece);
  if (const auto whole = token_ids_.find(mapped); whole != token_ids_.end()) {
    out->push_back(whole->second);
    return;
  }
  // Symbols: one per mapped character, then repeatedly merge the lowest-ranked pair.
  std::vector<std::string> sym;
  for (const uni::Char& c : uni::decode_utf8(mapped)) sym.emplace_back(mapped.substr(c.offset, c.len));
  std::string key;
  while (sym.size() > 1) {
    int32_t best = INT32_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      key.assign(sym[i]).append(" ").append(sym[i + 1]);
      const auto it = merge_rank_.find(key);
      if (it != merge_rank_.end() && it->second < best) {
        best = it->second;
        at = i;
      }
    }
    if (best == INT32_MAX) break;
    sym[at] += sym[at + 1];
    sym.erase(sym.begin() + static_cast<long>(at) + 1);
  }
  for (const std::string& s : sym) {
    if (const auto it = token_ids_.find(s); it != token_ids_.end()) {
      out->push_back(it->second);
      continue;
    }
    // Byte fallback: the symbol's bytes one token each.
    const auto raw = unicode_to_bytes(s);
    for (unsigned char b : raw.value_or(std::string())) {
      if (byte_token_[b] < 0) {
        *status = absl::FailedPreconditionError(absl::StrCat("the vocabulary has no token for byte 0x", absl::Hex(b)));
        return;
      }
      out->push_back(byte_token_[b]);
    }
  }
}

StatusOr<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  Status status;
  auto encode_plain = [&](std::string_view plain) {
    for (std::string_view piece : pretokenize(plain)) bpe_piece(piece, &out, &status);
  };
  size_t start = 0, i = 0;
  while (i < text.size() && status.ok()) {
    int32_t hit = -1;
    for (int32_t id : specials_) {
      const std::string& s = vocab_.tokens[id];
      if (token_type(id) == TokenType::kControl && !parse_special) continue;
      if (text.compare(i, s.size(), s) == 0) {
        hit = id;
        break;
      }
    }
    if (hit < 0) {
      ++i;
      continue;
    }
    encode_plain(text.substr(start, i - start));
    out.push_back(hit);
    i += vocab_.tokens[hit].size();
    start = i;
  }
  if (status.ok()) encode_plain(text.substr(start));
  if (!status.ok()) return status;
  return out;
}

StatusOr<std::string> Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= n_vocab()) {
    return absl::OutOfRangeError(absl::StrCat("token id ", id, " is outside the vocabulary (", n_vocab(), ")"));
  }
  const TokenType ty = token_type(id);
  if (ty == TokenType::kControl || ty == TokenType::kUserDefined) return vocab_.tokens[id];
  auto raw = unicode_to_bytes(vocab_.tokens[id]);
  return raw ? *raw : vocab_.tokens[id];  // not byte-level: its text as is
}

StatusOr<std::string> Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    ASSIGN_OR_RETURN(std::string b, token_bytes(id));
    if (skip_special && is_control(id)) continue;
    out += b;
  }
  return out;
}

StatusOr<std::string> Detokenizer::push(int32_t id) {
  ASSIGN_OR_RETURN(std::string b, t_.token_bytes(id));
  if (skip_special_ && t_.is_control(id)) return std::string();
  pending_ += b;
  const size_t n = complete_utf8_prefix(pending_);
  std::string ready = valid_utf8(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return ready;
}

std::string Detokenizer::flush() {
  std::string rest;
  if (!pending_.empty()) rest = "\xEF\xBF\xBD";  // U+FFFD for the incomplete character
  pending_.clear();
  return rest;
}

}  // namespace dsflash::tok
