// Fuzz target: a two-shard GGUF split set (byte 0 picks where the input is cut into shard 1
// and shard 2): split keys, shard counts, duplicate tensors across shards, and the set's
// tensor reads.
#include "common/gguf/gguf.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dsflash;
  if (size < 1) return 0;
  const size_t cut = 1 + (size - 1) * data[0] / 255;
  const std::string prefix = fuzz::temp_path("set");
  const std::string a = gguf::split_path(prefix, 1, 2), b = gguf::split_path(prefix, 2, 2);
  if (!fuzz::write_file(a, data + 1, cut - 1) || !fuzz::write_file(b, data + cut, size - cut)) return 0;
  auto m = gguf::Model::open(a);
  if (m.ok()) {
    uint8_t buf[32];
    for (const auto& t : (*m)->tensors()) {
      (void)(*m)->read(t, 0, buf, static_cast<size_t>(std::min<uint64_t>(sizeof(buf), t.n_bytes)));
    }
    (void)(*m)->total_bytes();
  }
  ::unlink(a.c_str());
  ::unlink(b.c_str());
  return 0;
}
