// dsflash-inference on the CUDA backend as a real process (label gpu; skipped without a GPU):
// tokens drawn on the device (the default) against the same requests drawn on the host
// (--sampling host) by a second process on the same model: greedy, temperature with top-k,
// top-p and min-p, penalties, and min_new_tokens (EOS banned until then), with and without
// logprobs. Both draw from the same seeded uniforms on the same device logits, so the tokens must
// agree, and the logprobs to the rounding of their normaliser's sum. Also prefix reuse, and
// requests taking turns (--max-running) against the same requests run alone.
#include <future>
#include <utility>
#include <vector>

#include "kernels/exec.h"
#include "tests/service/server_process.h"

namespace dsflash::testing {
namespace {

using dsflash::v1::GenerateRequest;

GenerateRequest request(float temperature, int top_k, float top_p, float min_p, uint64_t seed) {
  GenerateRequest req;
  req.set_prompt("Numbers and letters, side by side");
  auto* s = req.mutable_sampling();
  s->set_temperature(temperature);
  if (top_k > 0) s->set_top_k(top_k);
  s->set_top_p(top_p);
  if (min_p > 0.0f) s->set_min_p(min_p);
  s->set_seed(seed);
  req.mutable_stopping()->set_max_new_tokens(24);
  return req;
}

TEST(ServiceCuda, DeviceDrawsMatchHostDraws) {
  if (!kernels::cuda_available()) GTEST_SKIP() << "no CUDA device";
  ServerProcess dev({"--backend", "cuda"});
  ServerProcess host({"--backend", "cuda", "--sampling", "host"});
  ASSERT_TRUE(dev.ready()) << dev.log();
  ASSERT_TRUE(host.ready()) << host.log();
  grpc::ClientContext ctx;
  dsflash::v1::ModelInfo info;
  ASSERT_TRUE(dev.stub().GetModelInfo(&ctx, {}, &info).ok());
  EXPECT_EQ(info.backend(), "cuda");
  EXPECT_NE(dev.metrics().find("backend=\"cuda\""), std::string::npos);
  std::vector<GenerateRequest> reqs = {request(0.0f, 0, 1.0f, 0.0f, 1), request(1.0f, 0, 1.0f, 0.0f, 2),
                                       request(0.8f, 40, 0.9f, 0.0f, 3), request(1.2f, 0, 0.95f, 0.05f, 4)};
  GenerateRequest pen = request(0.9f, 0, 0.95f, 0.0f, 5);
  pen.mutable_sampling()->set_repetition_penalty(1.3f);
  pen.mutable_sampling()->set_presence_penalty(0.2f);
  pen.mutable_sampling()->set_frequency_penalty(0.1f);
  pen.mutable_stopping()->set_min_new_tokens(16);
  reqs.push_back(pen);
  // With logprobs (drawn on the device too since the twenty-eighth session): greedy with 5
  // alternatives, and the penalties' request (EOS banned at first) with 20.
  for (const auto& [base, top] : {std::pair{reqs[0], 5u}, std::pair{pen, 20u}}) {
    GenerateRequest lp = base;
    lp.mutable_output()->set_return_logprobs(true);
    lp.mutable_output()->set_top_logprobs(top);
    reqs.push_back(lp);
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto a = run_stream(dev.stub(), reqs[i]);
    const auto b = run_stream(host.stub(), reqs[i]);
    ASSERT_TRUE(a.status.ok()) << i << ": " << a.status.error_message();
    ASSERT_TRUE(b.status.ok()) << i << ": " << b.status.error_message();
    EXPECT_FALSE(a.ids().empty()) << i;
    EXPECT_EQ(a.ids(), b.ids()) << "request " << i;
    EXPECT_EQ(a.text(), b.text()) << "request " << i;
    if (!reqs[i].output().return_logprobs()) continue;
    size_t n = 0;
    for (size_t k = 0; k < a.events.size() && k < b.events.size(); ++k) {
      if (!a.events[k].has_tokens() || !b.events[k].has_tokens()) continue;
      ASSERT_EQ(a.events[k].tokens().logprobs_size(), b.events[k].tokens().logprobs_size()) << i << " event " << k;
      for (int j = 0; j < a.events[k].tokens().logprobs_size(); ++j, ++n) {
        const auto& g = a.events[k].tokens().logprobs(j);
        const auto& w = b.events[k].tokens().logprobs(j);
        EXPECT_NEAR(g.logprob(), w.logprob(), 1e-5) << "request " << i << " event " << k;
        EXPECT_EQ(std::vector<uint32_t>(g.top_ids().begin(), g.top_ids().end()),
                  std::vector<uint32_t>(w.top_ids().begin(), w.top_ids().end()))
            << "request " << i << " event " << k;
        ASSERT_EQ(g.top_logprobs_size(), static_cast<int>(reqs[i].output().top_logprobs()));
        for (int t = 0; t < g.top_logprobs_size(); ++t) {
          EXPECT_NEAR(g.top_logprobs(t), w.top_logprobs(t), 1e-5) << "request " << i << " event " << k;
        }
      }
    }
    EXPECT_EQ(n, a.ids().size()) << "request " << i << ": a logprob for every token";
  }
}

// The same tokens and log-probabilities, bit for bit.
void same_stream(const StreamResult& got, const StreamResult& want) {
  ASSERT_EQ(got.ids(), want.ids());
  for (size_t i = 0; i < got.events.size() && i < want.events.size(); ++i) {
    if (!got.events[i].has_tokens() || !want.events[i].has_tokens()) continue;
    const auto& g = got.events[i].tokens().logprobs(0);
    const auto& w = want.events[i].tokens().logprobs(0);
    EXPECT_EQ(g.logprob(), w.logprob()) << "token " << i;
    EXPECT_EQ(std::vector<float>(g.top_logprobs().begin(), g.top_logprobs().end()),
              std::vector<float>(w.top_logprobs().begin(), w.top_logprobs().end()))
        << "token " << i;
  }
}

// Prefix reuse on the CUDA backend (engine/prefix_cache.h): a chat's next turn continues the
// kept sequence (usage.cached_tokens), and after a prompt ending with <think> a turn that
// leaves the kept tokens at that last token (as thinking mode's next turn does) continues the
// copy of the state before it. Both servers run one token a call (--prefill-chunk 1), so the
// kept part was computed as the fresh server computes it (a whole prefill's GEMMs round
// differently from decode GEMVs, and the tiny random model amplifies that; golden README §3):
// the streams must agree bit for bit.
TEST(ServiceCuda, PrefixReuseContinuesKeptSequences) {
  if (!kernels::cuda_available()) GTEST_SKIP() << "no CUDA device";
  ServerProcess kept({"--backend", "cuda", "--prefill-chunk", "1"});
  ServerProcess fresh({"--backend", "cuda", "--prefill-chunk", "1", "--prefix-cache", "0"});
  ASSERT_TRUE(kept.ready()) << kept.log();
  ASSERT_TRUE(fresh.ready()) << fresh.log();
  GenerateRequest first = request(0.0f, 0, 1.0f, 0.0f, 7);
  first.mutable_output()->set_return_logprobs(true);
  first.mutable_output()->set_top_logprobs(5);
  first.clear_prompt();
  for (uint32_t id : {9u, 301u, 77u, 5u, 140u, 222u, 18u, 64u}) first.mutable_prompt_token_ids()->add_ids(id);
  const auto a = run_stream(kept.stub(), first);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  // The next turn: the first prompt, its reply, more.
  GenerateRequest next = first;
  for (uint32_t id : a.ids()) next.mutable_prompt_token_ids()->add_ids(id);
  for (uint32_t id : {61u, 62u, 63u}) next.mutable_prompt_token_ids()->add_ids(id);
  grpc::ClientContext tctx;
  dsflash::v1::TokenizeRequest treq;
  treq.set_text("<think>");
  treq.set_parse_special(true);
  dsflash::v1::TokenizeResponse think;
  ASSERT_TRUE(kept.stub().Tokenize(&tctx, treq, &think).ok());
  ASSERT_EQ(think.token_ids_size(), 1);
  next.mutable_prompt_token_ids()->add_ids(think.token_ids(0));
  const auto b = run_stream(kept.stub(), next);
  const auto want = run_stream(fresh.stub(), next);
  ASSERT_TRUE(b.status.ok() && want.status.ok()) << b.status.error_message() << want.status.error_message();
  EXPECT_EQ(b.events.back().final().usage().cached_tokens(), 8u + a.ids().size() - 1);
  same_stream(b, want);
  // A turn that leaves the kept tokens at the previous prompt's last token (<think>).
  GenerateRequest edited = next;
  const int last = next.prompt_token_ids().ids_size() - 1;
  edited.mutable_prompt_token_ids()->set_ids(last, think.token_ids(0) == 70u ? 71u : 70u);
  edited.mutable_prompt_token_ids()->add_ids(90u);
  const auto c = run_stream(kept.stub(), edited);
  const auto want_c = run_stream(fresh.stub(), edited);
  ASSERT_TRUE(c.status.ok() && want_c.status.ok());
  EXPECT_EQ(c.events.back().final().usage().cached_tokens(), static_cast<uint32_t>(last));
  same_stream(c, want_c);
}

// Requests taking turns on the device (--max-running 3): each sequence's graphs, caches and
// draws are its own, so each streams what it streams alone on the same server.
TEST(ServiceCuda, RequestsTakingTurnsGetWhatTheyGetAlone) {
  if (!kernels::cuda_available()) GTEST_SKIP() << "no CUDA device";
  ServerProcess server({"--backend", "cuda", "--max-running", "3", "--prefix-cache", "0"});
  ASSERT_TRUE(server.ready()) << server.log();
  std::vector<GenerateRequest> reqs;
  for (const char* text : {"Rivers and seas", "Numbers, one by one, up to forty", "A third"}) {
    GenerateRequest r = request(0.0f, 0, 1.0f, 0.0f, 9);
    r.set_prompt(text);
    reqs.push_back(r);
  }
  reqs[1].mutable_sampling()->set_temperature(0.8f);  // a seeded draw on the device too
  std::vector<std::future<StreamResult>> together;
  for (const auto& r : reqs) {
    together.push_back(std::async(std::launch::async, [&server, r] { return run_stream(server.stub(), r); }));
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    const StreamResult got = together[i].get();
    const StreamResult alone = run_stream(server.stub(), reqs[i]);
    ASSERT_TRUE(got.status.ok() && alone.status.ok()) << i << ": " << got.status.error_message();
    EXPECT_EQ(got.ids(), alone.ids()) << "request " << i;
  }
}

}  // namespace
}  // namespace dsflash::testing
