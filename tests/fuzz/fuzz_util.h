// Helpers shared by the fuzz targets: a process-private temp file, a tokenizer built once
// from a fixed corpus (byte-level BPE with the V4.1 specials), and a trap for violated
// properties (the fuzzer reports it like a crash).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "common/tokenizer/tokenizer.h"

namespace dsflash::fuzz {

inline std::string temp_path(const std::string& name) {
  return "/tmp/dsf_fuzz_" + std::to_string(::getpid()) + "_" + name;
}

inline bool write_file(const std::string& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(data, 1, size, f) == size;
  return std::fclose(f) == 0 && ok;
}

inline const tok::Tokenizer& tokenizer() {
  static const std::unique_ptr<tok::Tokenizer> t = [] {
    const char* corpus =
        "The expert store streams experts to the GPU. Hello world! 12345 tokens, 今天天气很好。 "
        "Ünïcödé text — with dashes; and (parentheses) [brackets] {braces}. def f(x): return x * 2\n"
        "Questions and answers. What does the model do? It predicts the next token.\n";
    auto r = tok::Tokenizer::create(tok::build_synthetic_vocab(corpus, 200));
    if (!r.ok()) __builtin_trap();
    return std::move(*r);
  }();
  return *t;
}

#define DSF_FUZZ_ASSERT(cond)                                                  \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "property violated: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      __builtin_trap();                                                        \
    }                                                                          \
  } while (0)

}  // namespace dsflash::fuzz
