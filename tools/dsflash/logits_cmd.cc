// `dsflash logits --model FILE --tokens 1,2,3 [--decode N] --out FILE.npy`: runs the CPU
// model on a prompt (one prefill) and N greedy single-token decode steps, writes the logits
// [S + N, vocab] as float32 .npy and prints the N greedy tokens, one per line.
#include <algorithm>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/gguf/gguf.h"
#include "inference_svc/model/model.h"
#include "tools/dsflash/args.h"
#include "tools/dsflash/commands.h"
#include "tools/dsflash/npy.h"

namespace dsflash::tools {
namespace {

StatusOr<std::vector<int32_t>> parse_tokens(const std::string& s) {
  std::vector<int32_t> out;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipWhitespace())) {
    int32_t id;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("--tokens: '", std::string(part), "' is not a token id"));
    }
    out.push_back(id);
  }
  if (out.empty()) return absl::InvalidArgumentError("--tokens: no token ids");
  return out;
}

Status run(const Args& args) {
  ASSIGN_OR_RETURN(auto tokens, parse_tokens(args.get_or("tokens", "")));
  ASSIGN_OR_RETURN(const int64_t n_decode, args.get_int("decode", 0));
  if (n_decode < 0) return absl::InvalidArgumentError("--decode must be >= 0");
  ASSIGN_OR_RETURN(auto file, gguf::Model::open(args.get_or("model", "")));
  ASSIGN_OR_RETURN(auto model, model::Model::load(*file));
  const int64_t V = model->config().n_vocab;
  auto seq = model->new_sequence();
  std::vector<float> all, logits;
  RETURN_IF_ERROR(model->forward(*seq, tokens, true, &logits));
  all = logits;
  std::vector<int32_t> greedy;
  for (int64_t i = 0; i < n_decode; ++i) {
    const float* last = &logits[logits.size() - V];
    const int32_t next = static_cast<int32_t>(std::max_element(last, last + V) - last);
    greedy.push_back(next);
    RETURN_IF_ERROR(model->forward(*seq, {next}, false, &logits));
    all.insert(all.end(), logits.begin(), logits.end());
  }
  RETURN_IF_ERROR(write_npy_f32(args.get_or("out", ""), all, static_cast<int64_t>(all.size()) / V, V));
  for (int32_t t : greedy) std::printf("%d\n", t);
  return absl::OkStatus();
}

}  // namespace

int logits_main(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {}, {"model", "tokens", "decode", "out"});
  if (!args.ok() || !args->has("model") || !args->has("tokens") || !args->has("out")) {
    std::fprintf(stderr, "usage: dsflash logits --model FILE --tokens 1,2,3 [--decode N] --out FILE.npy\n%s\n",
                 args.ok() ? "" : std::string(args.status().message()).c_str());
    return 2;
  }
  return exit_code(run(*args));
}

}  // namespace dsflash::tools
