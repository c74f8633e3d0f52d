// `dsflash generate`: streams a Generate from a running dsflash-inference and prints the text
// as it arrives (or every event as JSON with --json). The final event's summary goes to stderr.
#include <grpcpp/grpcpp.h>
#include <google/protobuf/util/json_util.h>

#include <chrono>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "dsflash/v1/inference.grpc.pb.h"
#include "tools/dsflash/args.h"
#include "tools/dsflash/commands.h"

namespace dsflash::tools {
namespace {

StatusOr<dsflash::v1::GenerateRequest> build_request(const Args& a) {
  dsflash::v1::GenerateRequest req;
  const std::string text = absl::StrJoin(a.positional(), " ");
  if (a.has("chat")) {
    auto* chat = req.mutable_chat();
    if (a.has("system")) {
      auto* m = chat->add_messages();
      m->set_role("system");
      m->set_content(*a.get("system"));
    }
    auto* m = chat->add_messages();
    m->set_role("user");
    m->set_content(text);
    chat->set_thinking(a.has("thinking"));
    chat->set_reasoning_effort(a.get_or("effort", ""));
  } else {
    req.set_prompt(text);
  }
  auto* s = req.mutable_sampling();
  auto real = [&](const char* name, auto setter) -> Status {
    if (!a.has(name)) return absl::OkStatus();
    double v;
    if (!absl::SimpleAtod(*a.get(name), &v)) return absl::InvalidArgumentError(absl::StrCat("--", name, " is not a number"));
    setter(v);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(real("temperature", [&](double v) { s->set_temperature(static_cast<float>(v)); }));
  RETURN_IF_ERROR(real("top-p", [&](double v) { s->set_top_p(static_cast<float>(v)); }));
  RETURN_IF_ERROR(real("top-k", [&](double v) { s->set_top_k(static_cast<int32_t>(v)); }));
  RETURN_IF_ERROR(real("min-p", [&](double v) { s->set_min_p(static_cast<float>(v)); }));
  RETURN_IF_ERROR(real("seed", [&](double v) { s->set_seed(static_cast<uint64_t>(v)); }));
  RETURN_IF_ERROR(real("max-tokens", [&](double v) { req.mutable_stopping()->set_max_new_tokens(static_cast<uint32_t>(v)); }));
  if (a.has("stop")) req.mutable_stopping()->add_stop(*a.get("stop"));
  if (a.has("logprobs")) req.mutable_output()->set_return_logprobs(true);
  return req;
}

}  // namespace

int generate_main(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {"chat", "thinking", "json", "logprobs"},
                          {"server", "system", "effort", "temperature", "top-p", "top-k", "min-p", "seed", "max-tokens",
                           "stop", "timeout"});
  if (!args.ok() || args->positional().empty()) {
    std::fprintf(stderr,
                 "usage: dsflash generate [--server ADDR] [--chat [--system S] [--thinking] [--effort E]] "
                 "[--temperature T] [--top-p P] [--top-k K] [--min-p M] [--seed N] [--max-tokens N] [--stop S] "
                 "[--logprobs] [--json] [--timeout SECONDS] PROMPT...\n%s\n",
                 args.ok() ? "" : std::string(args.status().message()).c_str());
    return 2;
  }
  auto req = build_request(*args);
  if (!req.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(req.status().message()).c_str());
    return 2;
  }
  auto channel = grpc::CreateChannel(args->get_or("server", "localhost:50051"), grpc::InsecureChannelCredentials());
  auto stub = dsflash::v1::Inference::NewStub(channel);
  grpc::ClientContext ctx;
  auto timeout = args->get_int("timeout", 600);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout.ok() ? *timeout : 600));
  auto reader = stub->Generate(&ctx, *req);
  dsflash::v1::GenerateEvent ev;
  bool got_final = false;
  while (reader->Read(&ev)) {
    if (args->has("json")) {
      std::string json;
      google::protobuf::util::JsonPrintOptions o;
      (void)google::protobuf::util::MessageToJsonString(ev, &json, o);
      std::printf("%s\n", json.c_str());
    } else if (ev.has_tokens()) {
      std::fputs(ev.tokens().text_delta().c_str(), stdout);
    } else if (ev.has_final()) {
      got_final = true;
      const auto& f = ev.final();
      std::fprintf(stderr, "\n[%s: %u prompt (%u cached) + %u generated tokens, ttft %.3f s, total %.3f s, seed %llu]\n",
                   dsflash::v1::FinishReason_Name(f.finish_reason()).c_str(), f.usage().prompt_tokens(),
                   f.usage().cached_tokens(), f.usage().completion_tokens(), f.timings().time_to_first_token_seconds(), f.timings().e2e_seconds(),
                   static_cast<unsigned long long>(f.seed()));
    }
    std::fflush(stdout);
  }
  const grpc::Status s = reader->Finish();
  if (!s.ok()) {
    std::fprintf(stderr, "\nerror: %s: %s\n", std::to_string(s.error_code()).c_str(), s.error_message().c_str());
    return 1;
  }
  if (!got_final && !args->has("json")) std::fprintf(stderr, "\nerror: the stream ended without a final event\n");
  return got_final || args->has("json") ? 0 : 1;
}

}  // namespace dsflash::tools
