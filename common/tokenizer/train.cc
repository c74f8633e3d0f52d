// A small deterministic byte-level BPE trainer for synthetic models: words from the
// DeepSeek-V3 pre-tokenizer, pair counts recomputed per merge (corpora here are kilobytes),
// the most frequent pair merged, ties broken by the smaller pair string.
#include <map>

#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/unicode.h"

namespace dsflash::tok {

TrainedBpe train_bpe(std::string_view corpus, size_t n_merges) {
  std::map<std::string, int64_t> word_counts;
  for (std::string_view piece : pretokenize(corpus)) ++word_counts[bytes_to_unicode(piece)];
  std::vector<std::pair<std::vector<std::string>, int64_t>> words;
  for (const auto& [w, n] : word_counts) {
    std::vector<std::string> sym;
    for (const uni::Char& c : uni::decode_utf8(w)) sym.push_back(w.substr(c.offset, c.len));
    words.emplace_back(std::move(sym), n);
  }
  TrainedBpe out;
  for (int b = 0; b < 256; ++b) out.tokens.push_back(bytes_to_unicode(std::string(1, static_cast<char>(b))));
  for (size_t m = 0; m < n_merges; ++m) {
    std::map<std::pair<std::string, std::string>, int64_t> pairs;
    for (const auto& [sym, n] : words) {
      for (size_t i = 0; i + 1 < sym.size(); ++i) pairs[{sym[i], sym[i + 1]}] += n;
    }
    const std::pair<std::string, std::string>* best = nullptr;
    int64_t best_n = 1;  // a pair must occur at least twice to be worth a token
    for (const auto& [p, n] : pairs) {
      if (n > best_n) {
        best = &p;
        best_n = n;
      }
    }
    if (best == nullptr) break;
    const auto [l, r] = *best;
    out.merges.push_back(l + " " + r);
    out.tokens.push_back(l + r);
    for (auto& [sym, n] : words) {
      std::vector<std::string> merged;
      for (size_t i = 0; i < sym.size(); ++i) {
        if (i + 1 < sym.size() && sym[i] == l && sym[i + 1] == r) {
          merged.push_back(l + r);
          ++i;
        } else {
          merged.push_back(sym[i]);
        }
      }
      sym = std::move(merged);
    }
  }
  return out;
}

Vocab build_synthetic_vocab(std::string_view corpus, size_t n_merges, size_t min_vocab) {
  Vocab v;
  for (const char* s : {kTokBos, kTokEos, kTokPad, kTokUser, kTokAssistant, kTokSystem, kTokThink, kTokThinkEnd}) {
    v.tokens.emplace_back(s);
    v.types.push_back(static_cast<int32_t>(TokenType::kControl));
  }
  v.bos = 0;
  v.eos = 1;
  v.pad = 2;
  TrainedBpe bpe = train_bpe(corpus, n_merges);
  for (std::string& t : bpe.tokens) {
    v.tokens.push_back(std::move(t));
    v.types.push_back(static_cast<int32_t>(TokenType::kNormal));
  }
  v.merges = std::move(bpe.merges);
  for (size_t i = 0; v.tokens.size() < min_vocab; ++i) {
    v.tokens.push_back("<|unused_" + std::to_string(i) + "|>");
    v.types.push_back(static_cast<int32_t>(TokenType::kUnused));
  }
  return v;
}

}  // namespace dsflash::tok
