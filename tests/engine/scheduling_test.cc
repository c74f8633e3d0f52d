// The engine's turn-taking (EngineOptions::max_running) on the CPU backend: requests running
// at once each stream what they would alone, bit for bit, and take turns (a new request's
// first token comes before a long one's last); with one running they go one after another;
// kept sequences count against --prefix-cache beside the running ones.
#include <mutex>

#include "gtest/gtest.h"
#include "tests/engine/engine_on_tiny_model.h"

namespace dsflash::engine {
namespace {

class Scheduling : public EngineOnTinyModel {
 protected:
  // Submits `prompts` at once (max_new_tokens each from `lengths`) to an engine running up to
  // `running` together; returns the requests' collectors and the order of their tokens events
  // (request indices).
  static std::vector<std::shared_ptr<Collector>> together(size_t running, const std::vector<std::string>& prompts,
                                                          const std::vector<uint32_t>& lengths,
                                                          std::vector<int>* order) {
    EngineOptions o;
    o.max_running = running;
    auto e = engine(0, o);
    std::mutex mu;
    std::vector<std::shared_ptr<Collector>> out;
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerateParams p = params(tokens(prompts[i]), lengths[i], 80 + i);
      EXPECT_TRUE(e->validate(p).ok());
      auto c = std::make_shared<Collector>();
      c->on_each = [&mu, order, i] {
        std::lock_guard<std::mutex> l(mu);
        order->push_back(static_cast<int>(i));
      };
      EXPECT_TRUE(e->submit(std::move(p), c).ok());
      out.push_back(c);
    }
    for (auto& c : out) c->done.get_future().wait();
    return out;
  }
  static size_t first(const std::vector<int>& order, int r) {
    return static_cast<size_t>(std::find(order.begin(), order.end(), r) - order.begin());
  }
  static size_t last(const std::vector<int>& order, int r) {
    return order.size() - 1 - static_cast<size_t>(std::find(order.rbegin(), order.rend(), r) - order.rbegin());
  }
};

const std::vector<std::string> kPrompts = {
    "A long answer about rivers, seas and the rain that feeds them, please",
    "Short question one?",
    "And a second short question, with a longer prompt to prefill in several chunks of seven",
};
const std::vector<uint32_t> kLengths = {48, 6, 6};

TEST_F(Scheduling, RequestsRunningTogetherStreamWhatTheyWouldAlone) {
  std::vector<int> order;
  const auto got = together(3, kPrompts, kLengths, &order);
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(got[i]->error.ok()) << got[i]->error;
    EXPECT_EQ(got[i]->ids.size(), kLengths[i]);
    expect_same_as_fresh(params(tokens(kPrompts[i]), kLengths[i], 80 + i), *got[i]);
  }
  // They took turns: the short ones ended before the long one did.
  EXPECT_LT(last(order, 1), last(order, 0));
  EXPECT_LT(last(order, 2), last(order, 0));
  EXPECT_LT(got[1]->fin.e2e_s, got[0]->fin.e2e_s);
}

TEST_F(Scheduling, OneRunningServesThemOneAfterAnother) {
  std::vector<int> order;
  const auto got = together(1, kPrompts, kLengths, &order);
  for (const auto& c : got) ASSERT_TRUE(c->error.ok()) << c->error;
  EXPECT_LT(last(order, 0), first(order, 1));
  EXPECT_LT(last(order, 1), first(order, 2));
  EXPECT_GT(got[2]->fin.queue_s, got[0]->fin.queue_s);
}

// Two conversations whose turns run at the same time, with room for two sequences: each
// next turn continues its own kept sequence (each was kept as its request ended, the other's
// still running or kept beside it).
TEST_F(Scheduling, ConversationsRunningTogetherContinueTheirOwnSequences) {
  EngineOptions o;
  o.max_running = 2;
  auto e = engine(2, o);
  const auto x = tokens("Conversation X begins here");
  const auto y = tokens("Conversation Y begins somewhere else entirely");
  auto ax = submit(*e, params(x, 5, 91));
  auto ay = submit(*e, params(y, 7, 92));
  ax->done.get_future().wait();
  ay->done.get_future().wait();
  ASSERT_TRUE(ax->error.ok() && ay->error.ok());
  const GenerateParams px = params(cat(cat(x, ax->ids), tokens(" more")), 5, 93);
  const GenerateParams py = params(cat(cat(y, ay->ids), tokens(" more")), 5, 94);
  auto bx = submit(*e, px);
  auto by = submit(*e, py);
  bx->done.get_future().wait();
  by->done.get_future().wait();
  ASSERT_TRUE(bx->error.ok() && by->error.ok());
  EXPECT_EQ(bx->fin.cached_tokens, x.size() + 4);
  EXPECT_EQ(by->fin.cached_tokens, y.size() + 6);
  expect_same_as_fresh(px, *bx);
  expect_same_as_fresh(py, *by);
}

}  // namespace
}  // namespace dsflash::engine
