// `dsflash tokenize` / `dsflash detokenize`: the model's tokenizer from the command line.
#include <cstdio>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "common/gguf/gguf.h"
#include "common/tokenizer/tokenizer.h"
#include "tools/dsflash/args.h"
#include "tools/dsflash/commands.h"

namespace dsflash::tools {
namespace {

StatusOr<std::unique_ptr<tok::Tokenizer>> load(const Args& args) {
  const auto path = args.get("model");
  if (!path) return absl::InvalidArgumentError("--model FILE is required");
  ASSIGN_OR_RETURN(auto model, gguf::Model::open(*path, gguf::File::Options{.map = false}));
  return tok::Tokenizer::from_gguf(*model);
}

// Usage errors (a missing or malformed --flag) exit 2, the rest 1 (args.h exit_code).
int fail(const Status& s) {
  const int code = exit_code(s);
  return absl::IsInvalidArgument(s) && s.message().find("--") == 0 ? 2 : code;
}

}  // namespace

int tokenize_main(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {"special", "chat", "thinking"}, {"model", "effort"});
  if (!args.ok()) return fail(args.status());
  auto t = load(*args);
  if (!t.ok()) return fail(t.status());
  const std::string text = absl::StrJoin(args->positional(), " ");
  StatusOr<std::vector<int32_t>> ids = absl::InternalError("unset");
  if (args->has("chat")) {
    tok::ChatOptions o;
    o.thinking = args->has("thinking");
    o.reasoning_effort = args->get_or("effort", "");
    ids = tok::encode_chat(**t, {{"user", text, ""}}, o);
  } else {
    ids = (*t)->encode(text, args->has("special"));
  }
  if (!ids.ok()) return fail(ids.status());
  std::vector<std::string> shown;
  for (int32_t id : *ids) {
    auto b = (*t)->token_bytes(id);
    shown.push_back(absl::StrCat(id, ":", b.ok() ? absl::CEscape(*b) : "?"));
  }
  std::printf("%zu tokens\n%s\n%s\n", ids->size(), absl::StrJoin(*ids, " ").c_str(), absl::StrJoin(shown, " | ").c_str());
  return 0;
}

int detokenize_main(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {"skip-special"}, {"model"});
  if (!args.ok()) return fail(args.status());
  auto t = load(*args);
  if (!t.ok()) return fail(t.status());
  std::vector<int32_t> ids;
  for (const std::string& s : args->positional()) {
    int32_t id;
    if (!absl::SimpleAtoi(s, &id)) return fail(absl::InvalidArgumentError(absl::StrCat("'", s, "' is not a token id")));
    ids.push_back(id);
  }
  auto text = (*t)->decode(ids, args->has("skip-special"));
  if (!text.ok()) return fail(text.status());
  std::printf("%s\n", text->c_str());
  return 0;
}

}  // namespace dsflash::tools
