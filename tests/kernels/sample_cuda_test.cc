// The device sampler (kernels/sample/sample_cuda.h) against the definition on the host
// (sample.h): edits bit for bit, greedy picks, and seeded draws at odd and real vocabulary
// sizes over flat, peaked and tied logits with every filter; a draw's log-probabilities against
// the engine's host sampler (inference_svc/engine/sampler.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>

#include "inference_svc/engine/sampler.h"
#include "kernels/sample/sample_cuda.h"
#include "tests/kernels/cuda_test_util.h"

namespace dsflash::kernels::sample {
namespace {

using testing::CudaStreamTest;
using testing::to_host;

class SampleCudaTest : public CudaStreamTest {
 protected:
  std::unique_ptr<DeviceSampler> sampler(int64_t V) {
    auto s = DeviceSampler::create(ctx(), V);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }
};

// shape 0: normal, 1: peaked (Zipf-like), 2: many exact ties; one id banned with -inf.
std::vector<float> logits_of(size_t V, int shape, std::mt19937& gen) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> l(V);
  for (size_t j = 0; j < V; ++j) {
    l[j] = shape == 0   ? 3.0f * nd(gen)
           : shape == 1 ? 12.0f - 1.1f * std::log(static_cast<float>(j % 977 + 1)) + 0.05f * nd(gen)
                        : std::round(2.0f * nd(gen)) / 2.0f;
  }
  if (V > 1) l[V / 2] = -INFINITY;
  return l;
}

TEST_F(SampleCudaTest, EditsMatchTheHostBitForBit) {
  std::mt19937 gen(3);
  std::vector<float> l = logits_of(4096, 0, gen);
  l[7] = 0.0f;
  const Penalties pen{1.3f, 0.4f, 0.25f};
  const std::vector<int32_t> generated = {7, 5, 5, 900, 4095, 5, 12, 900};
  const std::vector<Edit> edits = make_edits(generated, {12, 3000}, pen);
  ASSERT_EQ(edits.size(), 6u);  // 5, 7, 12 (banned and generated), 900, 3000, 4095
  std::vector<float> want = l;
  apply_edits(want.data(), edits, pen);
  float* d = dev(l);
  auto s = sampler(4096);
  ASSERT_NE(s, nullptr);
  auto t = s->draw(d, 4096, edits, pen, Params{0.0f, 0, 1.0f, 0.0f}, 0.0);
  ASSERT_TRUE(t.ok()) << t.status();
  const std::vector<float> got = to_host(d, 4096);
  for (size_t j = 0; j < got.size(); ++j) ASSERT_EQ(std::memcmp(&got[j], &want[j], 4), 0) << "id " << j;
  EXPECT_EQ(*t, argmax(want.data(), 4096));
  EXPECT_EQ(got[12], -INFINITY);
}

TEST_F(SampleCudaTest, GreedyTakesTheFirstLargest) {
  std::mt19937 gen(5);
  auto s = sampler(129280);
  ASSERT_NE(s, nullptr);
  for (const int64_t V : {1, 17, 31, 257, 4096, 129280}) {
    for (int shape = 0; shape < 3; ++shape) {
      const std::vector<float> l = logits_of(static_cast<size_t>(V), shape, gen);
      auto t = s->draw(dev(l), V, {}, {}, Params{0.0f, 0, 1.0f, 0.0f}, 0.0);
      ASSERT_TRUE(t.ok()) << t.status();
      EXPECT_EQ(*t, argmax(l.data(), V)) << "V=" << V << " shape " << shape;
    }
  }
  const std::vector<float> ties = {1.0f, 4.0f, 2.0f, 4.0f, 4.0f};
  EXPECT_EQ(*s->draw(dev(ties), 5, {}, {}, Params{0.0f, 0, 1.0f, 0.0f}, 0.0), 1);
  const std::vector<float> none(300, -INFINITY);
  EXPECT_EQ(*s->draw(dev(none), 300, {}, {}, Params{0.0f, 0, 1.0f, 0.0f}, 0.0), 0);
}

// Seeded draws against draw_reference: temperature alone, top-k (small and past a block),
// top-p, min-p and mixes; 60 draws a case (15 at the model's vocabulary, where the
// definition's full sort takes ~15 ms). Only summation order differs, so every pick agrees
// unless a draw lands within rounding of a boundary (about 1e-15 of the mass).
TEST_F(SampleCudaTest, DrawsMatchTheDefinition) {
  std::mt19937 gen(9);
  auto s = sampler(129280);
  ASSERT_NE(s, nullptr);
  int64_t draws = 0;
  for (const int64_t V : {1, 17, 31, 257, 4096, 129280}) {
    for (int shape = 0; shape < 3; ++shape) {
      const std::vector<float> l = logits_of(static_cast<size_t>(V), shape, gen);
      float* d = dev(l);
      for (const auto& [T, k, top_p, min_p] : std::vector<std::tuple<float, int, float, float>>{
               {1.0f, 0, 1.0f, 0.0f}, {0.7f, 40, 1.0f, 0.0f}, {1.3f, 0, 0.9f, 0.0f}, {1.0f, 1000, 0.95f, 0.0f},
               {0.8f, 0, 1.0f, 0.05f}, {1.0f, 50, 0.8f, 0.1f}, {0.25f, 0, 0.5f, 0.0f}}) {
        const Params p{T, k, top_p, min_p};
        std::mt19937_64 rng(static_cast<uint64_t>(V * 31 + shape));
        for (int i = 0; i < (V > 10000 ? 15 : 60); ++i, ++draws) {
          const double u = std::generate_canonical<double, 53>(rng);
          auto t = s->draw(d, V, {}, {}, p, u);
          ASSERT_TRUE(t.ok()) << t.status();
          ASSERT_EQ(*t, draw_reference(l.data(), V, p, u))
              << "V=" << V << " shape " << shape << " T=" << T << " k=" << k << " top_p=" << top_p
              << " min_p=" << min_p << " u=" << u;
        }
      }
    }
  }
  EXPECT_GT(draws, 1000);
}

// draw_logprobs: the same pick and edited logits as draw, and the log-probabilities the host
// reports for the logits before the penalties with the banned ids at -inf: the top ids (ties:
// lower id first) and every logit bit for bit, lse to rounding (its sum runs in another order).
TEST_F(SampleCudaTest, DrawLogprobsMatchTheHost) {
  std::mt19937 gen(13);
  auto s = sampler(129280);
  ASSERT_NE(s, nullptr);
  const Penalties pen{1.2f, 0.3f, 0.1f};
  for (const int64_t V : {17, 257, 4096, 129280}) {
    for (int shape = 0; shape < 3; ++shape) {
      const std::vector<float> l = logits_of(static_cast<size_t>(V), shape, gen);
      const std::vector<int32_t> generated = {3, 5, 5, static_cast<int32_t>(V - 1), 11};
      const std::vector<Edit> edits = make_edits(generated, {static_cast<int32_t>(V / 3)}, pen);
      for (const int top_n : {0, 1, 5, 20, 64}) {
        if (top_n > V) continue;
        for (const Params& p : {Params{0.0f, 0, 1.0f, 0.0f}, Params{0.9f, 40, 0.95f, 0.0f}}) {
          const double u = p.temperature > 0.0f ? 0.37 : 0.0;
          float *a = dev(l), *b = dev(l);
          DrawLogprobs got;
          auto t = s->draw_logprobs(a, V, edits, pen, p, u, top_n, &got);
          ASSERT_TRUE(t.ok()) << t.status();
          auto plain = s->draw(b, V, edits, pen, p, u);
          ASSERT_TRUE(plain.ok()) << plain.status();
          const std::string at = "V=" + std::to_string(V) + " shape " + std::to_string(shape) + " top " +
                                 std::to_string(top_n) + " T=" + std::to_string(p.temperature);
          ASSERT_EQ(*t, *plain) << at;
          const std::vector<float> ea = to_host(a, V), eb = to_host(b, V);
          ASSERT_EQ(std::memcmp(ea.data(), eb.data(), ea.size() * sizeof(float)), 0) << at;
          std::vector<float> raw = l;
          for (const Edit& e : edits) {
            if (e.banned != 0) raw[e.id] = -INFINITY;
          }
          const DrawLogprobs want = engine::Sampler::raw_logprobs(raw, *t, static_cast<uint32_t>(top_n));
          EXPECT_EQ(got.top_ids, want.top_ids) << at;
          ASSERT_EQ(got.top_logits.size(), want.top_logits.size()) << at;
          for (size_t i = 0; i < got.top_logits.size(); ++i) {
            EXPECT_EQ(std::memcmp(&got.top_logits[i], &want.top_logits[i], 4), 0) << at << " [" << i << "]";
          }
          EXPECT_EQ(std::memcmp(&got.chosen_logit, &want.chosen_logit, 4), 0) << at;
          EXPECT_NEAR(got.lse, want.lse, 1e-6f * std::max(1.0f, std::fabs(want.lse))) << at;
        }
      }
    }
  }
  float* d = dev(std::vector<float>(100, 0.0f));
  DrawLogprobs out;
  const Params greedy{0.0f, 0, 1.0f, 0.0f};
  EXPECT_EQ(s->draw_logprobs(d, 100, {}, {}, greedy, 0.0, DeviceSampler::kMaxTopLogprobs + 1, &out).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->draw_logprobs(d, 100, {}, {}, greedy, 0.0, -1, &out).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SampleCudaTest, RefusesBadInput) {
  auto s = sampler(100);
  ASSERT_NE(s, nullptr);
  float* d = dev(std::vector<float>(200, 0.0f));
  const Params greedy{0.0f, 0, 1.0f, 0.0f};
  EXPECT_EQ(s->draw(d, 200, {}, {}, greedy, 0.0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->draw(d, 0, {}, {}, greedy, 0.0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->draw(d, 100, {Edit{100, 1, 0}}, {}, greedy, 0.0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->draw(d, 100, {Edit{5, 1, 0}, Edit{5, 0, 1}}, {}, greedy, 0.0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->draw(d, 100, {}, {}, Params{1.0f, 0, 1.0f, 0.0f}, 1.0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->draw(d, 100, {}, {}, Params{1.0f, 0, 0.0f, 0.0f}, 0.5).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(s->draw(d, 100, {}, {}, Params{1.0f, 0, 1.0f, 0.0f}, 0.5).ok());
}

}  // namespace
}  // namespace dsflash::kernels::sample
