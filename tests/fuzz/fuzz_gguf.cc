// Fuzz target: one GGUF file through everything that reads an untrusted model file: the
// reader (header, metadata, tensor infos, extents), the V4.1 configuration and tensor
// inventory, the tokenizer vocabulary, and bounded tensor reads. Errors are fine; crashes,
// hangs, leaks and sanitizer reports are not.
#include "common/config/config.h"
#include "common/gguf/gguf.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace dsflash::fuzz {

void exercise(const gguf::Model& m) {
  for (const auto& [key, value] : m.metadata()) (void)m.find(key);
  uint8_t buf[64];
  for (const gguf::TensorInfo& t : m.tensors()) {
    DSF_FUZZ_ASSERT(m.find_tensor(t.name) != nullptr);
    (void)m.read(t, 0, buf, static_cast<size_t>(std::min<uint64_t>(sizeof(buf), t.n_bytes)));
    (void)m.read(t, t.n_bytes, buf, 1);  // out of range: an error
  }
  if (auto cfg = config::from_gguf(m); cfg.ok()) (void)config::validate_tensors(*cfg, m);
  (void)tok::Tokenizer::from_gguf(m);
  (void)m.fingerprint("_exps.");
}

}  // namespace dsflash::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dsflash;
  const std::string path = fuzz::temp_path("model.gguf");
  if (!fuzz::write_file(path, data, size)) return 0;
  for (bool map : {true, false}) {
    auto m = gguf::Model::open(path, gguf::File::Options{.map = map});
    if (m.ok()) fuzz::exercise(**m);
  }
  ::unlink(path.c_str());
  return 0;
}
