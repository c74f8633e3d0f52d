// Byte-level BPE tokenizer from a GGUF's tokenizer.ggml.* keys with the DeepSeek-V3
// pre-tokenizer (spec/model-v41.md §5), special/added tokens matched before BPE, byte
// fallback, incremental UTF-8-safe detokenisation, the V4.1 chat format, a BPE trainer (for
// synthetic models) and the Engram compressed-token-map builder (§3.1). A Tokenizer is
// immutable after creation and safe to share between threads; a Detokenizer is per stream.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/gguf/gguf.h"
#include "common/status.h"

namespace dsflash::tok {

// llama.cpp token types (tokenizer.ggml.token_type).
enum class TokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

struct Vocab {
  std::vector<std::string> tokens;  // GPT-2 byte-level strings; specials verbatim
  std::vector<int32_t> types;       // TokenType per token (empty: all normal)
  std::vector<std::string> merges;  // "left right", rank = index
  int32_t bos = -1, eos = -1, pad = -1;
  bool add_bos = false;
  std::string pre = "deepseek-v3";
};

class Tokenizer {
 public:
  // From tokenizer.ggml.{model,pre,tokens,token_type,merges,*_token_id,add_bos_token}.
  static StatusOr<std::unique_ptr<Tokenizer>> from_gguf(const gguf::Model& model);
  static StatusOr<std::unique_ptr<Tokenizer>> create(Vocab vocab);

  // Text -> ids. Control tokens' text is matched only with parse_special; user-defined
  // (added) tokens always. Never fails on any byte string (invalid UTF-8 goes through byte
  // fallback); errors only if the vocabulary lacks a byte token it needs.
  StatusOr<std::vector<int32_t>> encode(std::string_view text, bool parse_special = false) const;
  // Ids -> text; control tokens are skipped when skip_special. Invalid ids are errors.
  StatusOr<std::string> decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  // Raw bytes one token stands for (GPT-2 byte decoding; specials as their text).
  StatusOr<std::string> token_bytes(int32_t id) const;

  std::optional<int32_t> find(std::string_view token_text) const;
  const std::string& token_text(int32_t id) const { return vocab_.tokens[id]; }
  TokenType token_type(int32_t id) const;
  bool is_control(int32_t id) const { return token_type(id) == TokenType::kControl; }
  int32_t n_vocab() const { return static_cast<int32_t>(vocab_.tokens.size()); }
  int32_t bos() const { return vocab_.bos; }
  int32_t eos() const { return vocab_.eos; }
  int32_t pad() const { return vocab_.pad; }
  bool add_bos() const { return vocab_.add_bos; }
  const Vocab& vocab() const { return vocab_; }

 private:
  explicit Tokenizer(Vocab v) : vocab_(std::move(v)) {}
  void bpe_piece(std::string_view piece, std::vector<int32_t>* out, Status* status) const;

  Vocab vocab_;
  std::unordered_map<std::string, int32_t> token_ids_;
  std::unordered_map<std::string, int32_t> merge_rank_;     // "left right" -> rank
  std::vector<int32_t> specials_;                           // matched before BPE, longest first
  std::vector<int32_t> byte_token_;                         // byte -> id of its byte-level token
};

// Incremental detokeniser for streaming: returns valid UTF-8 only, never a split character
// (bytes that cannot form a character become U+FFFD).
class Detokenizer {
 public:
  Detokenizer(const Tokenizer& t, bool skip_special) : t_(t), skip_special_(skip_special) {}
  // Appends one token; returns the text that is now complete (possibly empty).
  StatusOr<std::string> push(int32_t id);
  // Returns what is left; an incomplete trailing sequence becomes U+FFFD.
  std::string flush();

 private:
  const Tokenizer& t_;
  bool skip_special_;
  std::string pending_;
};

// ---- pre-tokenizer and byte-level mapping -----------------------------------------------
// DeepSeek-V3 split (three regexes applied in sequence, matches and gaps kept): the pieces,
// as substrings of `text` whose concatenation is `text`.
std::vector<std::string_view> pretokenize(std::string_view text);
// GPT-2 byte-level form of raw bytes ("Ġ" for a space) and back (nullopt if a character is
// not a byte-level character).
std::string bytes_to_unicode(std::string_view bytes);
std::optional<std::string> unicode_to_bytes(std::string_view text);
// Length of the longest prefix of `s` made of complete UTF-8 characters, looking only at an
// incomplete sequence at the very end.
size_t complete_utf8_prefix(std::string_view s);
// `s` with every byte that is not part of a valid UTF-8 character replaced by U+FFFD.
std::string valid_utf8(std::string_view s);

// ---- chat format (V4.1 encoding, spec §5) -----------------------------------------------
struct ChatMessage {
  std::string role;       // system | user | assistant
  std::string content;
  std::string reasoning;  // assistant, thinking mode
};
struct ChatOptions {
  bool thinking = false;
  std::string reasoning_effort;  // "" (high), low, high, xhigh, max, or "1".."100"
  bool add_generation_prompt = true;
  bool add_bos = true;
};
StatusOr<std::vector<int32_t>> encode_chat(const Tokenizer& t, const std::vector<ChatMessage>& messages,
                                           const ChatOptions& options);
// The special-token texts of the V4.1 chat format.
inline constexpr const char* kTokBos = "<｜begin▁of▁sentence｜>";
inline constexpr const char* kTokEos = "<｜end▁of▁sentence｜>";
inline constexpr const char* kTokPad = "<｜▁pad▁｜>";
inline constexpr const char* kTokUser = "<｜User｜>";
inline constexpr const char* kTokAssistant = "<｜Assistant｜>";
inline constexpr const char* kTokSystem = "<｜System｜>";
inline constexpr const char* kTokThink = "<think>";
inline constexpr const char* kTokThinkEnd = "</think>";

// ---- training and Engram map --------------------------------------------------------------
struct TrainedBpe {
  std::vector<std::string> tokens;  // the 256 byte tokens, then one per merge
  std::vector<std::string> merges;
};
// Learns `n_merges` merges from `corpus` (pre-tokenized as above). Deterministic.
TrainedBpe train_bpe(std::string_view corpus, size_t n_merges);

// A complete vocabulary for synthetic models: BOS, EOS, PAD and the chat tokens (control),
// then the byte tokens and the merges learnt from `corpus`, padded with unused filler tokens
// to `min_vocab` entries when that is larger.
Vocab build_synthetic_vocab(std::string_view corpus, size_t n_merges, size_t min_vocab = 0);

// Engram compressed token map (spec §3.1): raw id -> compressed id, ids by first appearance
// of each normalised key (NFKC, NFD, strip marks, lowercase, collapse whitespace, strip).
StatusOr<std::vector<int32_t>> build_compressed_token_map(const Tokenizer& t);

}  // namespace dsflash::tok
