// Fuzz target: text through the tokenizer. Properties: encoding never fails on any bytes
// (byte fallback); for valid UTF-8 without special parsing, decode(encode(x)) == x; and the
// streaming detokenizer emits exactly the decoded text, one whole character at a time.
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dsflash;
  const tok::Tokenizer& t = fuzz::tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (bool special : {false, true}) {
    auto ids = t.encode(text, special);
    DSF_FUZZ_ASSERT(ids.ok());
    auto back = t.decode(*ids);
    DSF_FUZZ_ASSERT(back.ok());
    const bool valid = tok::valid_utf8(text) == text;
    if (!special) DSF_FUZZ_ASSERT(*back == text);
    tok::Detokenizer d(t, false);
    std::string streamed;
    for (int32_t id : *ids) {
      auto piece = d.push(id);
      DSF_FUZZ_ASSERT(piece.ok());
      DSF_FUZZ_ASSERT(tok::valid_utf8(*piece) == *piece);
      streamed += *piece;
    }
    streamed += d.flush();
    if (valid) DSF_FUZZ_ASSERT(streamed == *back);
  }
  (void)tok::pretokenize(text);
  return 0;
}
