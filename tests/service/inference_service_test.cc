// dsflash-inference as a real process over real gRPC: every RPC, the stream contract, seeded
// determinism, stop strings across token boundaries, UTF-8 boundaries, validation errors,
// deadlines, cancellation, queue-full rejection, health and drain on SIGTERM, and the metrics
// endpoint (checked with promtool when installed).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <map>

#include "common/tokenizer/unicode.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "inference_svc/model/model.h"
#include "tests/service/server_process.h"
#include "tools/dsflash/commands.h"

namespace dsflash::testing {
namespace {

using dsflash::v1::GenerateRequest;

GenerateRequest greedy(const std::string& prompt, uint32_t max_new) {
  GenerateRequest req;
  req.set_prompt(prompt);
  req.mutable_sampling()->set_temperature(0.0f);
  req.mutable_stopping()->set_max_new_tokens(max_new);
  req.mutable_stopping()->set_ignore_eos(true);
  return req;
}

bool valid_utf8(const std::string& s) {
  for (const auto& c : tok::uni::decode_utf8(s)) {
    if (c.cp < 0) return false;
  }
  return true;
}

class Service : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new ServerProcess(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(server_->ready()) << server_->log(); }
  static ServerProcess* server_;
};
ServerProcess* Service::server_ = nullptr;

TEST_F(Service, ModelInfoAndTokenize) {
  grpc::ClientContext c1;
  dsflash::v1::ModelInfo info;
  ASSERT_TRUE(server_->stub().GetModelInfo(&c1, {}, &info).ok());
  EXPECT_EQ(info.architecture(), "deepseek41");
  EXPECT_EQ(info.context_length(), 1024u);
  EXPECT_GT(info.vocab_size(), 500u);
  EXPECT_EQ(info.backend(), "cpu");
  grpc::ClientContext c2;
  dsflash::v1::TokenizeRequest treq;
  treq.set_text("The expert store");
  dsflash::v1::TokenizeResponse tres;
  ASSERT_TRUE(server_->stub().Tokenize(&c2, treq, &tres).ok());
  std::string joined;
  for (const auto& p : tres.pieces()) joined += p;
  EXPECT_EQ(joined, "The expert store");
  grpc::ClientContext c3;
  dsflash::v1::TokenizeRequest chat;
  auto* m = chat.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("hi");
  ASSERT_TRUE(server_->stub().Tokenize(&c3, chat, &tres).ok());
  EXPECT_GT(tres.token_ids_size(), 3);
}

TEST_F(Service, StreamContractAndUnaryAgree) {
  GenerateRequest req = greedy("The expert store streams", 24);
  const auto r = run_stream(server_->stub(), req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_GE(r.events.size(), 2u);
  for (size_t i = 0; i + 1 < r.events.size(); ++i) {
    ASSERT_TRUE(r.events[i].has_tokens()) << i;
    EXPECT_TRUE(valid_utf8(r.events[i].tokens().text_delta()));
  }
  ASSERT_TRUE(r.events.back().has_final());  // exactly one final, and nothing after it
  const auto& fin = r.events.back().final();
  EXPECT_EQ(fin.finish_reason(), dsflash::v1::LENGTH);
  EXPECT_EQ(fin.usage().completion_tokens(), 24u);
  EXPECT_EQ(r.ids().size(), 24u);
  EXPECT_FALSE(r.events[0].request_id().empty());
  grpc::ClientContext ctx;
  dsflash::v1::GenerateResult unary;
  ASSERT_TRUE(server_->stub().GenerateUnary(&ctx, req, &unary).ok());
  EXPECT_EQ(std::vector<uint32_t>(unary.token_ids().begin(), unary.token_ids().end()), r.ids());
  EXPECT_EQ(unary.text(), r.text());
}

// Greedy decoding through the service equals running the model in-process and taking argmax.
TEST_F(Service, GreedyMatchesTheModelInProcess) {
  GenerateRequest req = greedy("", 12);
  for (uint32_t id : {5u, 77u, 300u, 41u}) req.mutable_prompt_token_ids()->add_ids(id);
  const auto r = run_stream(server_->stub(), req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  auto file = gguf::Model::open(server_->model_path());
  ASSERT_TRUE(file.ok());
  auto m = model::Model::load(**file);
  ASSERT_TRUE(m.ok());
  auto seq = (*m)->new_sequence();
  std::vector<float> logits;
  ASSERT_TRUE((*m)->forward(*seq, {5, 77, 300, 41}, false, &logits).ok());
  std::vector<uint32_t> want;
  for (int i = 0; i < 12; ++i) {
    const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    want.push_back(static_cast<uint32_t>(next));
    ASSERT_TRUE((*m)->forward(*seq, {next}, false, &logits).ok());
  }
  EXPECT_EQ(r.ids(), want);
}

TEST_F(Service, SeededSamplingIsDeterministic) {
  GenerateRequest req;
  req.set_prompt("Numbers matter too");
  req.mutable_sampling()->set_temperature(1.0f);
  req.mutable_sampling()->set_top_p(0.9f);
  req.mutable_sampling()->set_seed(1234);
  req.mutable_stopping()->set_max_new_tokens(20);
  req.mutable_stopping()->set_ignore_eos(true);
  const auto a = run_stream(server_->stub(), req);
  const auto b = run_stream(server_->stub(), req);
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_EQ(a.ids(), b.ids());
  EXPECT_EQ(a.events.back().final().seed(), 1234u);
  req.mutable_sampling()->set_seed(99);
  const auto c = run_stream(server_->stub(), req);
  EXPECT_NE(a.ids(), c.ids());
}

TEST_F(Service, StopStringAcrossTokenBoundary) {
  const GenerateRequest base = greedy("Questions and answers.", 40);
  const auto full = run_stream(server_->stub(), base);
  ASSERT_TRUE(full.status.ok());
  // A stop string made of the end of one non-empty delta and the start of the next.
  std::string stop, before;
  std::string acc;
  for (size_t i = 0; i + 2 < full.events.size() && stop.empty(); ++i) {
    const std::string a = full.events[i].tokens().text_delta(), b = full.events[i + 1].tokens().text_delta();
    acc += a;
    if (a.size() >= 1 && b.size() >= 1 && valid_utf8(a.substr(a.size() - 1)) && valid_utf8(b.substr(0, 1))) {
      stop = a.substr(a.size() - 1) + b.substr(0, 1);
      before = acc.substr(0, acc.size() - 1);
      if (full.text().find(stop) < before.size()) stop.clear();  // must first occur here
    }
  }
  ASSERT_FALSE(stop.empty()) << "no two adjacent ASCII deltas in: " << full.text();
  GenerateRequest req = base;
  req.mutable_stopping()->add_stop(stop);
  const auto r = run_stream(server_->stub(), req);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.events.back().final().finish_reason(), dsflash::v1::STOP_SEQUENCE);
  EXPECT_EQ(r.events.back().final().matched_stop(), stop);
  EXPECT_EQ(r.text(), before);  // the stop text is not streamed
  req.mutable_stopping()->set_include_stop_in_output(true);
  EXPECT_EQ(run_stream(server_->stub(), req).text(), before + stop);
}

TEST_F(Service, StopTokenIdsMinTokensAndLogprobs) {
  const auto full = run_stream(server_->stub(), greedy("Whitespace comes in many shapes", 12));
  ASSERT_TRUE(full.status.ok());
  const uint32_t third = full.ids()[2];
  GenerateRequest req = greedy("Whitespace comes in many shapes", 12);
  req.mutable_stopping()->add_stop_token_ids(third);
  auto r = run_stream(server_->stub(), req);
  EXPECT_EQ(r.events.back().final().finish_reason(), dsflash::v1::STOP_TOKEN);
  EXPECT_EQ(r.ids().back(), third);
  req.mutable_output()->set_return_logprobs(true);
  req.mutable_output()->set_top_logprobs(3);
  req.mutable_stopping()->clear_stop_token_ids();
  r = run_stream(server_->stub(), req);
  ASSERT_TRUE(r.status.ok());
  for (size_t i = 0; i + 1 < r.events.size(); ++i) {
    const auto& lp = r.events[i].tokens().logprobs(0);
    EXPECT_EQ(lp.top_ids(0), lp.token_id());  // greedy picks the most likely token
    EXPECT_LE(lp.logprob(), 0.0f);
    EXPECT_GE(lp.top_logprobs(0), lp.top_logprobs(1));
  }
}

TEST_F(Service, InvalidRequestsNameTheField) {
  struct Case {
    std::function<void(GenerateRequest&)> edit;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](GenerateRequest& r) { r.clear_prompt(); }, "input"},
      {[](GenerateRequest& r) { r.mutable_prompt_token_ids()->add_ids(1u << 30); }, "prompt_token_ids"},
      {[](GenerateRequest& r) { r.mutable_stopping()->set_max_new_tokens(5000); }, "max_new_tokens"},
      {[](GenerateRequest& r) { r.mutable_sampling()->set_top_p(0.0f); }, "top_p"},
      {[](GenerateRequest& r) { r.mutable_sampling()->set_temperature(-1.0f); }, "temperature"},
      {[](GenerateRequest& r) { r.mutable_output()->set_top_logprobs(100); }, "top_logprobs"},
      {[](GenerateRequest& r) { r.mutable_stopping()->add_stop(""); }, "stop"},
      {[](GenerateRequest& r) {
         auto* m = r.mutable_chat()->add_messages();
         m->set_role("tool");
       },
       "chat"},
  };
  for (const auto& c : cases) {
    GenerateRequest req = greedy("x", 4);
    c.edit(req);
    const auto r = run_stream(server_->stub(), req);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_NE(r.status.error_message().find(c.field), std::string::npos) << r.status.error_message();
    EXPECT_TRUE(r.events.empty());
  }
}

TEST_F(Service, DeadlineExpiresMidStream) {
  const auto r = run_stream(server_->stub(), greedy("A long answer", 1000), std::chrono::milliseconds(300));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
}

TEST_F(Service, CancellationFreesTheSequence) {
  grpc::ClientContext ctx;
  auto reader = server_->stub().Generate(&ctx, greedy("A long answer", 1000));
  dsflash::v1::GenerateEvent ev;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(reader->Read(&ev));
  ctx.TryCancel();
  while (reader->Read(&ev)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The scheduler notices within a step: nothing runs, and the next request is served at once.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (metric_value(server_->metrics(), "llm_num_requests_running") != 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(metric_value(server_->metrics(), "llm_num_requests_running"), 0);
  EXPECT_TRUE(run_stream(server_->stub(), greedy("ok", 2), std::chrono::milliseconds(3000)).status.ok());
}

TEST_F(Service, MetricsPassPromtool) {
  const std::string text = server_->metrics();
  ASSERT_NE(text.find("llm_requests_total"), std::string::npos);
  ASSERT_NE(text.find("llm_time_to_first_token_seconds_bucket"), std::string::npos);
  if (std::system("command -v promtool > /dev/null") != 0) GTEST_SKIP() << "promtool not installed";
  TempDir dir;
  write_all(dir.file("m.txt"), std::vector<uint8_t>(text.begin(), text.end()));
  EXPECT_EQ(std::system(("promtool check metrics < " + dir.file("m.txt")).c_str()), 0);
}

TEST_F(Service, ChunkedPrefillServerGivesTheSameTokens) {
  ServerProcess chunked({"--prefill-chunk", "3"});
  ASSERT_TRUE(chunked.ready()) << chunked.log();
  GenerateRequest req = greedy("Questions and answers. What does the expert store do?", 16);
  const auto a = run_stream(server_->stub(), req);
  const auto b = run_stream(chunked.stub(), req);
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_GT(a.events.back().final().usage().prompt_tokens(), 6u);
  EXPECT_EQ(a.ids(), b.ids());
}

// A chat's next turn (the first prompt, its reply, a new message) continues the sequence the
// server kept: usage.cached_tokens counts what was not prefilled again, the metrics count it,
// and the tokens equal a server that keeps nothing.
TEST_F(Service, NextTurnReusesTheKeptPrefix) {
  ServerProcess fresh({"--prefix-cache", "0"});
  ASSERT_TRUE(fresh.ready()) << fresh.log();
  const double cached_before = metric_value(server_->metrics(), "llm_prompt_tokens_cached_total");
  GenerateRequest first = greedy("", 12);
  for (uint32_t id : {9u, 301u, 77u, 5u, 140u, 222u, 18u}) first.mutable_prompt_token_ids()->add_ids(id);
  const auto a = run_stream(server_->stub(), first);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  GenerateRequest next = first;
  for (uint32_t id : a.ids()) next.mutable_prompt_token_ids()->add_ids(id);
  for (uint32_t id : {61u, 62u, 63u}) next.mutable_prompt_token_ids()->add_ids(id);
  const auto b = run_stream(server_->stub(), next);
  const auto want = run_stream(fresh.stub(), next);
  ASSERT_TRUE(b.status.ok() && want.status.ok());
  const auto& usage = b.events.back().final().usage();
  EXPECT_EQ(usage.prompt_tokens(), 7u + 12u + 3u);
  EXPECT_EQ(usage.cached_tokens(), 7u + 12u - 1u);  // the reply's last token was drawn, not run
  EXPECT_EQ(want.events.back().final().usage().cached_tokens(), 0u);
  EXPECT_EQ(b.ids(), want.ids());
  const std::string m = server_->metrics();
  EXPECT_EQ(metric_value(m, "llm_prompt_tokens_cached_total") - cached_before, 18.0);
  EXPECT_NE(m.find("llm_prefix_cache_requests_total{result=\"hit\"}"), std::string::npos);
  EXPECT_NE(m.find("backend=\"cpu\""), std::string::npos);
  EXPECT_GE(metric_value(m, "llm_prefix_cache_tokens"), 7.0 + 12 + 3 + 12 - 1);
}

// --prefix-copy all: every prompt keeps a copy of its state before its last token, so the
// same prompt sent again (a regenerated reply) prefills that one token alone; the default
// (think) keeps none for a plain prompt.
TEST(ServicePrefixCopy, AllServesTheSamePromptAgain) {
  for (const bool all : {true, false}) {
    ServerProcess server(all ? std::vector<std::string>{"--prefix-copy", "all"} : std::vector<std::string>{});
    ASSERT_TRUE(server.ready()) << server.log();
    GenerateRequest req = greedy("", 6);
    for (uint32_t id : {9u, 301u, 77u, 5u, 140u, 222u, 18u}) req.mutable_prompt_token_ids()->add_ids(id);
    const auto a = run_stream(server.stub(), req);
    const auto b = run_stream(server.stub(), req);
    ASSERT_TRUE(a.status.ok() && b.status.ok()) << b.status.error_message();
    EXPECT_EQ(b.events.back().final().usage().cached_tokens(), all ? 6u : 0u) << all;
    EXPECT_EQ(a.ids(), b.ids());
  }
}

// The last value of each metric in a bench/results.csv-format file.
std::map<std::string, double> last_values(const std::string& path) {
  std::map<std::string, double> v;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> f(1);
    bool quoted = false;
    for (char c : line) {
      if (c == '"') quoted = !quoted;
      else if (c == ',' && !quoted) f.emplace_back();
      else f.back() += c;
    }
    if (f.size() == 8 && f[3] == "serving") v[f[5]] = std::atof(f[6].c_str());
  }
  return v;
}

// `dsflash loadgen` against a real server: each figure's row, and the prompt tokens it reports
// as taken from kept sequences are exactly what the server's --prefix-copy all gives: the same
// 24-token prompt three times (the copy of its first 23 serves the second and third), a
// conversation of three turns (each continues the previous turn's kept state).
TEST(ServiceLoadgen, ReportsServingFiguresThroughTheApi) {
  ServerProcess server({"--prefix-copy", "all"});
  ASSERT_TRUE(server.ready()) << server.log();
  TempDir dir;
  const std::string csv = dir.file("serving.csv");
  int seed = 0;  // each run's own prompts
  auto loadgen = [&](const char* mode, std::vector<std::string> more = {}) {
    std::vector<std::string> args = {"--server", server.address(), "--mode", mode, "--requests", "3",
                                     "--prompt-tokens", "24", "--max-tokens", "4", "--csv", csv,
                                     "--seed", std::to_string(++seed)};
    args.insert(args.end(), more.begin(), more.end());
    return tools::loadgen_main(args);
  };
  ASSERT_EQ(loadgen("fresh"), 0);
  auto v = last_values(csv);
  EXPECT_EQ(v["cached_prompt_share"], 0.0);
  EXPECT_GT(v["ttft_ms_p50"], 0.0);
  EXPECT_GE(v["ttft_ms_p99"], v["ttft_ms_p50"]);
  EXPECT_GT(v["tpot_ms_p50"], 0.0);
  EXPECT_GT(v["output_tokens_per_s"], 0.0);
  EXPECT_GT(v["requests_per_s"], 0.0);
  ASSERT_EQ(loadgen("same"), 0);
  EXPECT_NEAR(last_values(csv)["cached_prompt_share"], 2.0 * 23 / (3 * 24), 1e-5);  // 6 digits in the file
  // Turns of 24, 24 + 4 + 16 and 44 + 4 + 16 prompt tokens; the second and third continue the
  // state kept after the turn before (its prompt and all but the last reply token).
  ASSERT_EQ(loadgen("turns", {"--turn-tokens", "16"}), 0);
  EXPECT_NEAR(last_values(csv)["cached_prompt_share"], (27.0 + 47) / (24 + 44 + 64), 1e-5);
  EXPECT_EQ(loadgen("sideways"), 1);  // a bad mode: refused before any request
  EXPECT_EQ(tools::loadgen_main({"--server", "unix:" + dir.file("nobody.sock"), "--csv", csv, "--timeout", "2"}), 1);
}

// Against a server still loading its model: refused at once by default, run once loaded with
// --wait-ready; an address nobody answers fails after the wait.
TEST(ServiceLoadgen, WaitReadyWaitsForALoadingServer) {
  ServerProcess server({"--load-rate-mbps", "2"}, /*wait_ready=*/false);
  ASSERT_TRUE(server.serving(""));
  ASSERT_FALSE(server.serving("dsflash.v1.Inference"));  // still loading
  TempDir dir;
  const std::string csv = dir.file("serving.csv");
  const std::vector<std::string> args = {"--server", server.address(), "--requests", "1", "--prompt-tokens", "8",
                                         "--max-tokens", "2", "--csv", csv};
  EXPECT_EQ(tools::loadgen_main(args), 1);
  std::vector<std::string> waiting = args;
  waiting.insert(waiting.end(), {"--wait-ready", "60"});
  ASSERT_EQ(tools::loadgen_main(waiting), 0) << server.log();
  EXPECT_GT(last_values(csv)["ttft_ms_p50"], 0.0);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(tools::loadgen_main({"--server", "unix:" + dir.file("nobody.sock"), "--csv", csv, "--wait-ready", "1"}), 1);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
}

// A host memory floor above what this machine has: requests are refused with
// RESOURCE_EXHAUSTED naming the floor, never run; the memory gauges show the real figures.
TEST(ServiceMemory, AFloorAboveMemAvailableRefusesRequests) {
  ServerProcess server({"--min-mem-available", "64T"});
  ASSERT_TRUE(server.ready()) << server.log();
  const auto r = run_stream(server.stub(), greedy("Hello", 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(r.status.error_message().find("--min-mem-available"), std::string::npos) << r.status.error_message();
  EXPECT_TRUE(r.ids().empty());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (metric_value(server.metrics(), "llm_host_mem_total_bytes") <= 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string m = server.metrics();
  EXPECT_GT(metric_value(m, "llm_host_mem_total_bytes"), 0.0);
  EXPECT_GT(metric_value(m, "llm_host_mem_available_bytes"), 0.0);
  EXPECT_NE(m.find("llm_admission_rejections_total{reason=\"memory\"} 1"), std::string::npos);
}

TEST_F(Service, ReflectionListsTheServices) {
  auto reflection = grpc::reflection::v1alpha::ServerReflection::NewStub(server_->channel());
  grpc::ClientContext ctx;
  auto stream = reflection->ServerReflectionInfo(&ctx);
  grpc::reflection::v1alpha::ServerReflectionRequest req;
  req.set_list_services("*");
  ASSERT_TRUE(stream->Write(req));
  stream->WritesDone();
  grpc::reflection::v1alpha::ServerReflectionResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  std::vector<std::string> names;
  for (const auto& svc : resp.list_services_response().service()) names.push_back(svc.name());
  EXPECT_NE(std::find(names.begin(), names.end(), "dsflash.v1.Inference"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "grpc.health.v1.Health"), names.end());
  while (stream->Read(&resp)) {
  }
  EXPECT_TRUE(stream->Finish().ok());
}

TEST(ServiceLoading, UnavailableUntilLoaded) {
  ServerProcess server({"--load-rate-mbps", "2"}, /*wait_ready=*/false);
  EXPECT_TRUE(server.serving(""));  // alive
  EXPECT_FALSE(server.serving("dsflash.v1.Inference"));  // not ready
  grpc::ClientContext ctx;
  dsflash::v1::ModelInfo info;
  EXPECT_EQ(server.stub().GetModelInfo(&ctx, {}, &info).error_code(), grpc::StatusCode::UNAVAILABLE);
  const auto r = run_stream(server.stub(), greedy("early", 2));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  const double progress = metric_value(server.metrics(), "llm_model_load_progress_ratio");
  EXPECT_GE(progress, 0.0);
  EXPECT_LT(progress, 1.0);
  ASSERT_TRUE(server.wait_ready(std::chrono::seconds(30))) << server.log();
  EXPECT_EQ(metric_value(server.metrics(), "llm_model_load_progress_ratio"), 1.0);
  EXPECT_TRUE(run_stream(server.stub(), greedy("late", 2)).status.ok());
}

// A short request sent while a long one streams finishes first (they take turns), with the
// tokens it gets when it runs alone.
TEST(ServiceScheduling, AShortRequestIsNotHeldBehindALongOne) {
  ServerProcess server;
  ASSERT_TRUE(server.ready()) << server.log();
  auto long_run = std::async(std::launch::async, [&] {
    return run_stream(server.stub(), greedy("long", 1000), std::chrono::milliseconds(3000));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto short_run = run_stream(server.stub(), greedy("short", 5));
  ASSERT_TRUE(short_run.status.ok()) << short_run.status.error_message();
  EXPECT_EQ(long_run.wait_for(std::chrono::seconds(0)), std::future_status::timeout) << "the long one ended first";
  long_run.wait();
  const auto alone = run_stream(server.stub(), greedy("short", 5));
  ASSERT_TRUE(alone.status.ok());
  EXPECT_EQ(short_run.ids(), alone.ids());
}

// Two running (--max-running 2) and one waiting (--max-queue 1): a fourth is refused.
TEST(ServiceAdmission, QueueFullIsResourceExhausted) {
  ServerProcess server({"--max-queue", "1", "--max-running", "2"});
  ASSERT_TRUE(server.ready()) << server.log();
  auto long_stream = [&] { return run_stream(server.stub(), greedy("long", 1000), std::chrono::milliseconds(4000)); };
  std::vector<std::future<StreamResult>> longs;
  for (int i = 0; i < 3; ++i) {
    longs.push_back(std::async(std::launch::async, long_stream));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  const std::string m = server.metrics();
  EXPECT_EQ(metric_value(m, "llm_num_requests_running"), 2);
  EXPECT_EQ(metric_value(m, "llm_num_requests_waiting"), 1);
  const auto c = run_stream(server.stub(), greedy("more", 10));
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << c.status.error_message();
  for (auto& f : longs) f.wait();
  EXPECT_NE(server.metrics().find("llm_admission_rejections_total{reason=\"queue_full\"} 1"), std::string::npos);
  // Streams that ended by deadline or cancellation leave nothing behind: the server exits at once.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(server.stop(), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(ServiceDrain, SigtermFinishesInFlightThenExits) {
  ServerProcess server({"--grace-seconds", "20"});
  ASSERT_TRUE(server.ready()) << server.log();
  auto stream = std::async(std::launch::async, [&] { return run_stream(server.stub(), greedy("drain", 150)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::kill(server.pid(), SIGTERM);
  // Readiness turns off and new work is refused while the stream finishes.
  bool refused = false;
  for (int i = 0; i < 100 && !refused; ++i) {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    req.set_service("dsflash.v1.Inference");
    grpc::health::v1::HealthCheckResponse resp;
    if (server.health().Check(&ctx, req, &resp).ok() && resp.status() == grpc::health::v1::HealthCheckResponse::NOT_SERVING) {
      refused = run_stream(server.stub(), greedy("late", 2)).status.error_code() == grpc::StatusCode::UNAVAILABLE;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(refused);
  const auto r = stream.get();
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.events.back().final().usage().completion_tokens(), 150u);
  EXPECT_EQ(server.stop(), 0);
}

}  // namespace
}  // namespace dsflash::testing
