// Fuzz target: arbitrary token-id sequences (including ids outside the vocabulary) through
// decode and the streaming detokenizer: unknown ids are errors, output is always valid
// UTF-8, and skipping specials never adds text.
#include <cstring>

#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dsflash;
  const tok::Tokenizer& t = fuzz::tokenizer();
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < size; i += 2) {
    int16_t v;
    std::memcpy(&v, data + i, 2);
    ids.push_back(static_cast<int32_t>(v) % (t.n_vocab() + 8));  // some out of range, some negative
  }
  for (bool skip : {false, true}) {
    tok::Detokenizer d(t, skip);
    std::string out;
    for (int32_t id : ids) {
      auto piece = d.push(id);
      const bool known = id >= 0 && id < t.n_vocab();
      DSF_FUZZ_ASSERT(piece.ok() == known);
      if (piece.ok()) out += *piece;
    }
    out += d.flush();
    DSF_FUZZ_ASSERT(tok::valid_utf8(out) == out);
    (void)t.decode(ids, skip);
  }
  return 0;
}
