// Fuzz target: chat conversations through the V4.1 chat renderer: '\0' separates messages,
// byte 0 picks thinking, reasoning effort and the roles (including invalid ones). Invalid
// conversations are errors; valid ones render to token ids the tokenizer can decode.
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dsflash;
  if (size < 1) return 0;
  const tok::Tokenizer& t = fuzz::tokenizer();
  static const char* kRoles[] = {"system", "user", "assistant", "tool", "", "User"};
  static const char* kEffort[] = {"", "low", "medium", "high", "max", "bogus"};
  tok::ChatOptions o;
  o.thinking = data[0] & 1;
  o.reasoning_effort = kEffort[(data[0] >> 1) % 6];
  std::vector<tok::ChatMessage> msgs;
  std::string cur;
  uint8_t role = data[0] >> 4;
  for (size_t i = 1; i <= size; ++i) {
    if (i == size || data[i] == 0) {
      msgs.push_back({kRoles[role++ % 6], cur, (role & 4) ? cur.substr(0, cur.size() / 2) : std::string()});
      cur.clear();
    } else {
      cur += static_cast<char>(data[i]);
    }
  }
  auto ids = tok::encode_chat(t, msgs, o);
  if (ids.ok()) DSF_FUZZ_ASSERT(t.decode(*ids).ok());
  return 0;
}
