// The DeepSeek-V4.1 chat format (official encoding_dsv41, spec/model-v41.md §5):
//   BOS [<｜System｜>[Reasoning Effort: E (...)\n\n][system]] {<｜User｜>text <｜Assistant｜>
//   [</think>|<think>reasoning</think>]answer EOS} ... <｜Assistant｜><think>|</think>
// Role and think tokens are looked up by their text; message text is tokenized without
// special-token parsing so that user content can never inject control tokens.
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/tokenizer.h"

namespace dsflash::tok {
namespace {

StatusOr<int> effort_value(const std::string& e) {
  if (e.empty() || e == "high") return 50;
  if (e == "low") return 25;
  if (e == "xhigh") return 75;
  if (e == "max") return 100;
  int v = 0;
  if (absl::SimpleAtoi(e, &v) && v >= 1 && v <= 100) return v;
  return absl::InvalidArgumentError(absl::StrCat("reasoning effort '", e, "' is not low, high, xhigh, max or 1..100"));
}

class Builder {
 public:
  explicit Builder(const Tokenizer& t) : t_(t) {}
  Status special(const char* text) {
    const auto id = t_.find(text);
    if (!id) return absl::FailedPreconditionError(absl::StrCat("the vocabulary has no chat token '", text, "'"));
    ids.push_back(*id);
    return absl::OkStatus();
  }
  Status text(const std::string& s) {
    ASSIGN_OR_RETURN(auto v, t_.encode(s, /*parse_special=*/false));
    ids.insert(ids.end(), v.begin(), v.end());
    return absl::OkStatus();
  }
  std::vector<int32_t> ids;

 private:
  const Tokenizer& t_;
};

}  // namespace

StatusOr<std::vector<int32_t>> encode_chat(const Tokenizer& t, const std::vector<ChatMessage>& messages,
                                           const ChatOptions& o) {
  if (messages.empty()) return absl::InvalidArgumentError("a chat needs at least one message");
  ASSIGN_OR_RETURN(const int effort, effort_value(o.reasoning_effort));
  size_t last_user = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant") {
      return absl::InvalidArgumentError(absl::StrCat("message ", i, " has role '", r, "' (system, user or assistant)"));
    }
    if (r == "user") last_user = i;
  }
  Builder b(t);
  if (o.add_bos) {
    if (t.bos() < 0) return absl::FailedPreconditionError("the vocabulary has no BOS token");
    b.ids.push_back(t.bos());
  }
  size_t first = 0;
  if (messages[0].role == "system" || o.thinking) {
    RETURN_IF_ERROR(b.special(kTokSystem));
    if (o.thinking) {
      RETURN_IF_ERROR(b.text(absl::StrCat("Reasoning Effort: ", effort,
                                          " (range 1-100, the higher the value, the more thorough the reasoning)\n\n")));
    }
    if (messages[0].role == "system") {
      RETURN_IF_ERROR(b.text(messages[0].content));
      first = 1;
    }
  }
  bool header_open = false;  // <｜Assistant｜> emitted, answer not yet written
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "system") {
      RETURN_IF_ERROR(b.special(kTokSystem));
      RETURN_IF_ERROR(b.text(m.content));
      header_open = false;
    } else if (m.role == "user") {
      RETURN_IF_ERROR(b.special(kTokUser));
      RETURN_IF_ERROR(b.text(m.content));
      header_open = false;
    } else {
      if (!header_open) RETURN_IF_ERROR(b.special(kTokAssistant));
      // Reasoning is kept only for the answer to the last user message in thinking mode.
      if (o.thinking && i > last_user) {
        RETURN_IF_ERROR(b.special(kTokThink));
        RETURN_IF_ERROR(b.text(m.reasoning));
      }
      RETURN_IF_ERROR(b.special(kTokThinkEnd));
      RETURN_IF_ERROR(b.text(m.content));
      if (t.eos() < 0) return absl::FailedPreconditionError("the vocabulary has no EOS token");
      b.ids.push_back(t.eos());
      header_open = false;
    }
    if (m.role == "user" && i + 1 < messages.size() && messages[i + 1].role == "assistant") {
      RETURN_IF_ERROR(b.special(kTokAssistant));
      header_open = true;
    }
  }
  if (o.add_generation_prompt && messages.back().role != "assistant") {
    RETURN_IF_ERROR(b.special(kTokAssistant));
    RETURN_IF_ERROR(b.special(o.thinking ? kTokThink : kTokThinkEnd));
  }
  return b.ids;
}

}  // namespace dsflash::tok
