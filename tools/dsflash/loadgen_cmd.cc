// `dsflash loadgen`: a serving benchmark through a running dsflash-inference's streamed
// Generate, timed as a client sees it. C client threads send N requests in all (greedy, EOS
// ignored, so each streams exactly --max-tokens tokens) of --prompt-tokens token ids drawn
// from the vocabulary, in one of three patterns:
//   fresh  every request a new prompt (no prefix reuse possible);
//   same   each thread sends its one prompt again and again (a regenerated reply);
//   turns  each thread is a conversation: a request re-sends the previous prompt and its reply,
//          then --turn-tokens new ids (a chat's next turn).
// --think ends every prompt with the vocabulary's <think> (thinking mode's generation prompt).
// The ids come from --seed, a new one each run unless given. --wait-ready S waits up to S
// seconds for a server that is still starting or loading its model (default: fails at once).
// Rows (benchmark "serving") go to --csv: time to first token (p50/p90/p99), time per output
// token after the first (p50/p99), end to end, aggregate output tokens/s, and the share of
// prompt tokens the server took from kept sequences (usage.cached_tokens).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dsflash/v1/inference.grpc.pb.h"
#include "tools/dsflash/args.h"
#include "tools/dsflash/bench_csv.h"
#include "tools/dsflash/commands.h"

namespace dsflash::tools {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string server, csv, label, mode;
  int64_t requests = 8, concurrency = 1, prompt_tokens = 64, max_tokens = 32, turn_tokens = 16, timeout_s = 600,
          wait_ready_s = 0;
  uint64_t seed = 1;
  bool think = false;
};

// What one request looked like from the client.
struct Sample {
  double ttft_ms = 0, tpot_ms = 0, e2e_ms = 0;
  uint32_t prompt = 0, cached = 0, generated = 0;
};

struct Target {
  uint32_t vocab = 0, max_prompt = 0;
  std::string backend, model;
  std::optional<uint32_t> think;
};

// GetModelInfo, again every half second while the server is unreachable or still loading
// (UNAVAILABLE) and --wait-ready has time left.
StatusOr<dsflash::v1::ModelInfo> model_info(dsflash::v1::Inference::Stub& stub, const Options& o) {
  const auto until = Clock::now() + std::chrono::seconds(o.wait_ready_s);
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    dsflash::v1::ModelInfo info;
    const grpc::Status s = stub.GetModelInfo(&ctx, {}, &info);
    if (s.ok()) return info;
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE || Clock::now() >= until) {
      const std::string waited = o.wait_ready_s > 0 ? absl::StrCat(" (waited ", o.wait_ready_s, " s)") : "";
      return absl::UnavailableError(absl::StrCat("GetModelInfo at ", o.server, ": ", s.error_message(), waited));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

StatusOr<Target> query_target(dsflash::v1::Inference::Stub& stub, const Options& o) {
  Target t;
  ASSIGN_OR_RETURN(const dsflash::v1::ModelInfo info, model_info(stub, o));
  t.vocab = info.vocab_size(), t.max_prompt = info.max_prompt_tokens();
  t.backend = info.backend(), t.model = info.model_name();
  if (o.think) {
    grpc::ClientContext tctx;
    dsflash::v1::TokenizeRequest req;
    req.set_text("<think>");
    req.set_parse_special(true);
    dsflash::v1::TokenizeResponse resp;
    const grpc::Status ts = stub.Tokenize(&tctx, req, &resp);
    if (!ts.ok()) return absl::UnavailableError(absl::StrCat("Tokenize: ", ts.error_message()));
    if (resp.token_ids_size() != 1) return absl::FailedPreconditionError("--think: the vocabulary has no <think> token");
    t.think = resp.token_ids(0);
  }
  return t;
}

// One streamed request: the token ids it generated appended to `reply`.
StatusOr<Sample> one_request(dsflash::v1::Inference::Stub& stub, const Options& o, const std::vector<uint32_t>& prompt,
                             std::vector<uint32_t>* reply) {
  dsflash::v1::GenerateRequest req;
  for (uint32_t id : prompt) req.mutable_prompt_token_ids()->add_ids(id);
  req.mutable_sampling()->set_temperature(0.0f);
  req.mutable_stopping()->set_max_new_tokens(static_cast<uint32_t>(o.max_tokens));
  req.mutable_stopping()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(o.timeout_s));
  const auto t0 = Clock::now();
  auto reader = stub.Generate(&ctx, req);
  dsflash::v1::GenerateEvent ev;
  Sample s;
  Clock::time_point first, last;
  bool got_final = false;
  while (reader->Read(&ev)) {
    if (ev.has_tokens() && ev.tokens().token_ids_size() > 0) {
      last = Clock::now();
      if (s.generated == 0) first = last;
      s.generated += static_cast<uint32_t>(ev.tokens().token_ids_size());
      reply->insert(reply->end(), ev.tokens().token_ids().begin(), ev.tokens().token_ids().end());
    } else if (ev.has_final()) {
      got_final = true;
      s.prompt = ev.final().usage().prompt_tokens();
      s.cached = ev.final().usage().cached_tokens();
    }
  }
  const grpc::Status st = reader->Finish();
  if (!st.ok()) return absl::InternalError(absl::StrCat("Generate: code ", st.error_code(), ": ", st.error_message()));
  if (!got_final || s.generated == 0) return absl::InternalError("Generate: the stream ended without tokens and a final event");
  const auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  s.ttft_ms = ms(first - t0), s.e2e_ms = ms(Clock::now() - t0);
  s.tpot_ms = s.generated > 1 ? ms(last - first) / (s.generated - 1) : 0.0;
  return s;
}

// One client thread's requests in order (its conversation in turns mode).
Status client(dsflash::v1::Inference::Stub& stub, const Options& o, const Target& t, int64_t n, uint64_t seed,
              std::vector<Sample>* out) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<uint32_t> id(3, t.vocab - 1);
  auto fresh = [&](int64_t k) {
    std::vector<uint32_t> v(static_cast<size_t>(k));
    for (auto& x : v) x = id(rng);
    return v;
  };
  auto ended = [&](std::vector<uint32_t> v) {
    if (t.think) v.push_back(*t.think);
    return v;
  };
  std::vector<uint32_t> base = fresh(o.prompt_tokens - (t.think ? 1 : 0));
  std::vector<uint32_t> prompt = ended(base);
  for (int64_t i = 0; i < n; ++i) {
    if (i > 0 && o.mode == "fresh") prompt = ended(base = fresh(o.prompt_tokens - (t.think ? 1 : 0)));
    std::vector<uint32_t> reply;
    ASSIGN_OR_RETURN(const Sample s, one_request(stub, o, prompt, &reply));
    out->push_back(s);
    if (o.mode == "turns") {
      prompt.insert(prompt.end(), reply.begin(), reply.end());
      const std::vector<uint32_t> more = fresh(o.turn_tokens);
      prompt.insert(prompt.end(), more.begin(), more.end());
      if (t.think) prompt.push_back(*t.think);
      if (prompt.size() > t.max_prompt) {
        return absl::OutOfRangeError(absl::StrCat("turns: the conversation outgrew the server's ", t.max_prompt,
                                                  " prompt tokens; fewer --requests or --turn-tokens"));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<BenchRow> summary(const std::vector<Sample>& all, double wall_s) {
  std::vector<double> ttft, tpot, e2e;
  double generated = 0, prompt = 0, cached = 0;
  for (const Sample& s : all) {
    ttft.push_back(s.ttft_ms), e2e.push_back(s.e2e_ms);
    if (s.generated > 1) tpot.push_back(s.tpot_ms);
    generated += s.generated, prompt += s.prompt, cached += s.cached;
  }
  std::vector<BenchRow> rows = {{"ttft_ms_p50", percentile(ttft, 0.5), "ms (client: send to first token)"},
                                {"ttft_ms_p90", percentile(ttft, 0.9), "ms"},
                                {"ttft_ms_p99", percentile(ttft, 0.99), "ms"},
                                {"e2e_ms_p50", percentile(e2e, 0.5), "ms"}};
  if (!tpot.empty()) {
    rows.push_back({"tpot_ms_p50", percentile(tpot, 0.5), "ms (per output token after the first)"});
    rows.push_back({"tpot_ms_p99", percentile(tpot, 0.99), "ms"});
  }
  rows.push_back({"output_tokens_per_s", generated / wall_s, "tok/s (all streams)"});
  rows.push_back({"requests_per_s", static_cast<double>(all.size()) / wall_s, "req/s"});
  rows.push_back({"cached_prompt_share", prompt > 0 ? cached / prompt : 0.0, "ratio (usage.cached_tokens / prompt)"});
  return rows;
}

StatusOr<Options> parse(const Args& a) {
  Options o;
  o.server = a.get_or("server", "localhost:50051"), o.csv = a.get_or("csv", "bench/results.csv");
  o.mode = a.get_or("mode", "fresh"), o.think = a.has("think");
  if (o.mode != "fresh" && o.mode != "same" && o.mode != "turns") {
    return absl::InvalidArgumentError("--mode must be fresh, same or turns");
  }
  ASSIGN_OR_RETURN(o.requests, a.get_int("requests", 8));
  ASSIGN_OR_RETURN(o.concurrency, a.get_int("concurrency", 1));
  ASSIGN_OR_RETURN(o.prompt_tokens, a.get_int("prompt-tokens", 64));
  ASSIGN_OR_RETURN(o.max_tokens, a.get_int("max-tokens", 32));
  ASSIGN_OR_RETURN(o.turn_tokens, a.get_int("turn-tokens", 16));
  ASSIGN_OR_RETURN(o.timeout_s, a.get_int("timeout", 600));
  ASSIGN_OR_RETURN(o.wait_ready_s, a.get_int("wait-ready", 0));
  // Prompts from a new seed unless one is given: a server keeps sequences across runs, and an
  // earlier run's prompts would be served from them.
  ASSIGN_OR_RETURN(const int64_t seed, a.get_int("seed", static_cast<int64_t>(std::random_device{}() >> 1)));
  o.seed = static_cast<uint64_t>(seed);
  if (o.requests < 1 || o.concurrency < 1 || o.concurrency > 256 || o.prompt_tokens < 2 || o.max_tokens < 1 ||
      o.turn_tokens < 1 || o.timeout_s < 1 || o.wait_ready_s < 0) {
    return absl::InvalidArgumentError(
        "--requests >= 1, --concurrency 1..256, --prompt-tokens >= 2, --max-tokens, --turn-tokens, --timeout >= 1, "
        "--wait-ready >= 0");
  }
  return o;
}

Status run(const Args& a) {
  ASSIGN_OR_RETURN(const Options o, parse(a));
  auto stub = dsflash::v1::Inference::NewStub(grpc::CreateChannel(o.server, grpc::InsecureChannelCredentials()));
  ASSIGN_OR_RETURN(const Target t, query_target(*stub, o));
  if (t.vocab < 4) return absl::FailedPreconditionError("the server's vocabulary is too small to draw prompts from");
  if (static_cast<uint64_t>(o.prompt_tokens) > t.max_prompt) {
    return absl::InvalidArgumentError(absl::StrCat("--prompt-tokens ", o.prompt_tokens, " exceeds the server's ",
                                                   t.max_prompt));
  }
  std::vector<std::vector<Sample>> per(static_cast<size_t>(o.concurrency));
  std::vector<Status> status(per.size());
  const auto t0 = Clock::now();
  {
    std::vector<std::jthread> threads;
    for (int64_t c = 0; c < o.concurrency; ++c) {
      const int64_t n = o.requests / o.concurrency + (c < o.requests % o.concurrency ? 1 : 0);
      threads.emplace_back([&, c, n] { status[c] = client(*stub, o, t, n, o.seed * 1000003 + c, &per[c]); });
    }
  }
  const double wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  for (const Status& s : status) RETURN_IF_ERROR(s);
  std::vector<Sample> all;
  for (const auto& v : per) all.insert(all.end(), v.begin(), v.end());
  const std::string config = absl::StrCat(a.get_or("label", t.model), " backend=", t.backend, " mode=", o.mode,
                                          o.think ? " think" : "", " requests=", o.requests, " concurrency=",
                                          o.concurrency, " prompt=", o.prompt_tokens, " max_tokens=", o.max_tokens,
                                          o.mode == "turns" ? absl::StrCat(" turn_tokens=", o.turn_tokens) : "");
  return append_bench_rows(o.csv, "serving", config, summary(all, wall_s));
}

}  // namespace

int loadgen_main(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {"think"},
                          {"server", "requests", "concurrency", "prompt-tokens", "max-tokens", "mode", "turn-tokens",
                           "seed", "csv", "label", "timeout", "wait-ready"});
  if (!args.ok()) {
    std::fprintf(stderr,
                 "usage: dsflash loadgen [--server ADDR] [--mode fresh|same|turns] [--requests N] [--concurrency C] "
                 "[--prompt-tokens P] [--max-tokens M] [--turn-tokens T] [--think] [--seed S] [--csv PATH] "
                 "[--label L] [--timeout SECONDS] [--wait-ready SECONDS]\n%s\n",
                 std::string(args.status().message()).c_str());
    return 2;
  }
  return exit_code(run(*args));
}

}  // namespace dsflash::tools
