// Sampler and stop-string matcher on hand-built inputs: greedy, top-k / top-p / min-p
// support, seeded determinism, penalties, logprobs; stops across pieces, hold-back and
// include-stop behaviour.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "inference_svc/engine/sampler.h"
#include "inference_svc/engine/stop_matcher.h"

namespace dsflash::engine {
namespace {

std::vector<float> logits() { return {1.0f, 3.0f, 2.0f, 0.5f, 2.9f}; }

std::set<int32_t> support(SamplingParams p, int draws = 400) {
  std::set<int32_t> seen;
  for (int i = 0; i < draws; ++i) {
    p.seed = static_cast<uint64_t>(i);
    Sampler s(p);
    auto l = logits();
    seen.insert(s.sample(l, {}));
  }
  return seen;
}

TEST(Sampler, GreedyAndFilters) {
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler g(p);
  auto l = logits();
  EXPECT_EQ(g.sample(l, {}), 1);
  p.temperature = 1.0f;
  p.top_k = 2;
  EXPECT_EQ(support(p), (std::set<int32_t>{1, 4}));
  p.top_k = 0;
  p.top_p = 0.01f;  // only the most likely token
  EXPECT_EQ(support(p), (std::set<int32_t>{1}));
  p.top_p = 1.0f;
  p.min_p = 0.5f;  // prob >= 0.5 x max: id 4 (ratio e^-0.1) stays, id 2 (e^-1 = 0.37) goes
  EXPECT_EQ(support(p), (std::set<int32_t>{1, 4}));
  p.min_p = 0.0f;
  EXPECT_EQ(support(p, 2000).size(), 5u);  // plain temperature sampling reaches every token
}

TEST(Sampler, SeededDrawsRepeat) {
  SamplingParams p;
  p.seed = 42;
  Sampler a(p), b(p);
  for (int i = 0; i < 50; ++i) {
    auto la = logits(), lb = logits();
    EXPECT_EQ(a.sample(la, {}), b.sample(lb, {}));
  }
}

// The Sampler sorts only as far as a draw reads, and sums a full-vocabulary normaliser in
// storage order; it must pick the tokens of the definition (kernels/sample/sample.h
// draw_reference: every id sorted) with the same seeded uniforms.
// Vocabularies of the model's size and small ones; flat, peaked (Zipf-like) and tied logits
// with banned (-inf) ids; temperature alone, with top-k (small and past the first sorted run),
// top-p, min-p and their mix; 200 seeded draws each (20 at the model's size, where the
// definition's full sort takes ~15 ms a draw).
TEST(Sampler, MatchesTheFullSortDefinition) {
  std::mt19937 gen(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const size_t V : {size_t{7}, size_t{300}, size_t{129280}}) {
    for (int shape = 0; shape < 3; ++shape) {
      std::vector<float> l(V);
      for (size_t j = 0; j < V; ++j) {
        l[j] = shape == 0   ? 3.0f * nd(gen)
               : shape == 1 ? 12.0f - 1.1f * std::log(static_cast<float>(j % 977 + 1)) + 0.05f * nd(gen)
                            : std::round(2.0f * nd(gen)) / 2.0f;  // many exact ties
      }
      l[V / 2] = -INFINITY;
      for (const auto& [T, k, top_p, min_p] : std::vector<std::tuple<float, int, float, float>>{
               {1.0f, 0, 1.0f, 0.0f}, {0.7f, 40, 1.0f, 0.0f}, {1.3f, 0, 0.9f, 0.0f}, {1.0f, 1000, 0.95f, 0.0f},
               {0.8f, 0, 1.0f, 0.05f}, {1.0f, 50, 0.8f, 0.1f}}) {
        SamplingParams p;
        p.temperature = T, p.top_k = k, p.top_p = top_p, p.min_p = min_p, p.seed = V + 17 * shape;
        Sampler s(p);
        std::mt19937_64 rng(p.seed);
        for (int d = 0; d < (V > 1000 ? 20 : 200); ++d) {
          std::vector<float> a = l;
          ASSERT_EQ(s.sample(a, {}), kernels::sample::draw_reference(l.data(), static_cast<int64_t>(V), s.params(),
                                                                   std::generate_canonical<double, 53>(rng)))
              << "V=" << V << " shape " << shape << " T=" << T << " k=" << k << " top_p=" << top_p
              << " min_p=" << min_p << " draw " << d;
        }
      }
    }
  }
}

TEST(Sampler, Penalties) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.presence_penalty = 5.0f;  // token 1 already generated: 3 - 5 < 2.9
  Sampler s(p);
  auto l = logits();
  EXPECT_EQ(s.sample(l, {1}), 4);
  SamplingParams r;
  r.temperature = 0.0f;
  r.repetition_penalty = 2.0f;  // positive logits divided: 3 -> 1.5, 2.9 -> 1.45, so 2 (2.0) wins
  Sampler t(r);
  auto m = logits();
  EXPECT_EQ(t.sample(m, {1, 4}), 2);
  SamplingParams f;
  f.temperature = 0.0f;
  f.frequency_penalty = 0.06f;  // twice: 3 - 0.12 < 2.9
  Sampler u(f);
  auto n = logits();
  EXPECT_EQ(u.sample(n, {1, 1}), 4);
}

TEST(Sampler, Logprobs) {
  const auto l = logits();
  const auto lp = Sampler::logprobs(l, 2, 3);
  double z = 0;
  for (float v : l) z += std::exp(v);
  EXPECT_NEAR(lp.logprob, 2.0 - std::log(z), 1e-5);
  EXPECT_EQ(lp.top_ids, (std::vector<int32_t>{1, 4, 2}));
  EXPECT_NEAR(lp.top_logprobs[0], 3.0 - std::log(z), 1e-5);
}

TEST(StopMatcher, SpansPiecesAndHoldsBack) {
  StopMatcher m({"END", "\n\n"}, false);
  auto a = m.push("hello E");
  EXPECT_EQ(a.text, "hello ");  // "E" may start "END": held back
  EXPECT_FALSE(a.match);
  auto b = m.push("N");
  EXPECT_EQ(b.text, "");
  auto c = m.push("Dtail");
  ASSERT_TRUE(c.match);
  EXPECT_EQ(*c.match, "END");
  EXPECT_EQ(c.text, "");  // the stop is not streamed
  StopMatcher n({"END"}, false);
  EXPECT_EQ(n.push("EN").text, "");
  EXPECT_EQ(n.push("x").text, "ENx");  // not a stop after all: released
  StopMatcher inc({"END"}, true);
  auto d = inc.push("aEND");
  EXPECT_EQ(d.text, "aEND");
  StopMatcher early({"ab"}, false);
  auto e = early.push("ab", /*check=*/false);  // before min_new_tokens stops do not match...
  EXPECT_FALSE(e.match);
  EXPECT_EQ(e.text + early.flush(), "ab");     // ...and the text is kept
}

}  // namespace
}  // namespace dsflash::engine
