// Prefix reuse (engine/prefix_cache.h): which kept sequence serves a prompt, and, through the
// engine on the CPU backend, that a request continuing a kept sequence (or the kept copy of a
// prompt's state before its last token) streams the same tokens and log-probabilities, bit
// for bit, as the same request prefilled whole.
#include "inference_svc/engine/prefix_cache.h"

#include <mutex>

#include "gtest/gtest.h"
#include "tests/engine/engine_on_tiny_model.h"

namespace dsflash::engine {
namespace {

PrefixCache::Entry entry(std::vector<int32_t> tokens) {
  PrefixCache::Entry e{std::make_unique<model::Sequence>(), std::move(tokens)};
  e.seq->n_past = static_cast<int64_t>(e.tokens.size());
  return e;
}

TEST(PrefixCache, TakesTheLongestProperPrefix) {
  PrefixCache c(3);
  c.put(entry({1, 2}));
  c.put(entry({1, 2, 3, 4}));
  c.put(entry({7, 8, 9}));
  EXPECT_EQ(c.size(), 3u);
  EXPECT_EQ(c.tokens(), 9u);
  // {1,2,3,4} equals the prompt: no token would be left to run, so {1,2} serves.
  auto hit = c.take({1, 2, 3, 4});
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->tokens, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(c.size(), 2u);
  c.put(std::move(*hit));
  hit = c.take({1, 2, 3, 4, 5});
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->tokens, (std::vector<int32_t>{1, 2, 3, 4}));
  // A diverging prompt misses, and the miss makes room for its new sequence (3 - 1 kept).
  c.put(entry({5, 6}));
  ASSERT_EQ(c.size(), 3u);
  EXPECT_FALSE(c.take({1, 3, 3, 4, 5}).has_value());
  EXPECT_EQ(c.size(), 2u);
  EXPECT_FALSE(c.take({7, 8, 9}).has_value());  // equal, not a proper prefix
  c.put(entry({4}));
  ASSERT_EQ(c.size(), 3u);
  c.reserve(2);  // room for a running sequence and a copy of it
  EXPECT_EQ(c.size(), 1u);
  EXPECT_TRUE(c.take({4, 0}).has_value());  // the most recent stayed
}

TEST(PrefixCache, KeepsOnlyWhatItMayAndDropsTheOldest) {
  PrefixCache c(2);
  c.put(entry({1}));
  c.put(entry({2}));
  c.put(entry({3}));  // the oldest ({1}) goes
  EXPECT_EQ(c.size(), 2u);
  EXPECT_FALSE(c.take({1, 0}).has_value());
  PrefixCache::Entry stale = entry({4, 5});
  stale.seq->n_past = 1;  // a state that does not cover its tokens is never kept
  c.put(std::move(stale));
  c.put(PrefixCache::Entry{nullptr, {6}});
  EXPECT_LE(c.size(), 2u);
  EXPECT_FALSE(c.take({4, 5, 6}).has_value());
  PrefixCache off(0);
  off.put(entry({1}));
  EXPECT_EQ(off.size(), 0u);
  EXPECT_FALSE(off.take({1, 2}).has_value());
}

class PrefixReuse : public EngineOnTinyModel {
 protected:
  void second_turn_continues_the_first(size_t kept);
};

// A chat's second turn re-sends the first prompt and reply: only the rest is prefilled, and
// the contexts are long enough (past the window and the indexer's top-k) for every cache of
// the kept state to matter.
TEST_F(PrefixReuse, ASecondTurnContinuesTheFirstBitForBit) {
  for (size_t kept : {1, 2}) {
    SCOPED_TRACE(kept);
    second_turn_continues_the_first(kept);
  }
}

void PrefixReuse::second_turn_continues_the_first(size_t kept) {
  auto e = engine(kept);
  const auto first = tokens("The first question of a long conversation about numbers, letters and rivers");
  const auto a = run(*e, params(first, 20, 11));
  ASSERT_TRUE(a->error.ok()) << a->error;
  EXPECT_EQ(a->fin.cached_tokens, 0u);
  const GenerateParams second = params(cat(cat(first, a->ids), tokens(" and then a follow-up question")), 16, 12);
  const auto b = run(*e, second);
  ASSERT_TRUE(b->error.ok()) << b->error;
  // The last reply token was drawn, never run: the kept state ends one before it.
  EXPECT_EQ(b->fin.cached_tokens, first.size() + a->ids.size() - 1);
  EXPECT_EQ(b->fin.prompt_tokens, second.prompt.size());
  expect_same_as_fresh(second, *b);
  // A third turn continues the second's sequence in turn.
  const GenerateParams third = params(cat(cat(second.prompt, b->ids), tokens(" thanks")), 8, 13);
  const auto c = run(*e, third);
  ASSERT_TRUE(c->error.ok()) << c->error;
  EXPECT_EQ(c->fin.cached_tokens, second.prompt.size() + b->ids.size() - 1);
  expect_same_as_fresh(third, *c);
}

// A prompt that leaves the kept tokens (an edited earlier turn) is prefilled whole.
TEST_F(PrefixReuse, ADivergingPromptIsPrefilledWhole) {
  auto e = engine(1);
  const auto first = tokens("Rivers run to the sea, and the sea runs nowhere at all");
  const auto a = run(*e, params(first, 6, 21));
  ASSERT_TRUE(a->error.ok()) << a->error;
  std::vector<int32_t> edited = cat(first, a->ids);
  edited[3] = edited[3] == 5 ? 6 : 5;
  const GenerateParams p = params(cat(edited, tokens(" again")), 6, 22);
  const auto b = run(*e, p);
  ASSERT_TRUE(b->error.ok()) << b->error;
  EXPECT_EQ(b->fin.cached_tokens, 0u);
  expect_same_as_fresh(p, *b);
}

// DeepSeek's thinking mode renders an earlier reply without its reasoning, so the next turn
// leaves the kept tokens at the first prompt's last token (<think> then, </think> now): the
// copy of the state before that token serves it.
TEST_F(PrefixReuse, AThinkingChatsNextTurnUsesThePromptsCopy) {
  auto e = engine(2);
  tok::ChatOptions o;
  o.thinking = true;
  std::vector<tok::ChatMessage> chat = {{"user", "What do rivers carry to the sea?", ""}};
  const auto first = *tok::encode_chat(*tok_, chat, o);
  const auto a = run(*e, params(first, 12, 51));
  ASSERT_TRUE(a->error.ok()) << a->error;
  EXPECT_EQ(a->fin.cached_tokens, 0u);
  const auto reply = tok_->decode(a->ids, /*skip_special=*/true);
  ASSERT_TRUE(reply.ok()) << reply.status();
  chat.push_back({"assistant", *reply, "some reasoning"});
  chat.push_back({"user", "And what does the sea give back?", ""});
  const GenerateParams next = params(*tok::encode_chat(*tok_, chat, o), 10, 52);
  ASSERT_TRUE(std::equal(first.begin(), first.end() - 1, next.prompt.begin()));
  ASSERT_NE(next.prompt[first.size() - 1], first.back());
  const auto b = run(*e, next);
  ASSERT_TRUE(b->error.ok()) << b->error;
  EXPECT_EQ(b->fin.cached_tokens, first.size() - 1);
  expect_same_as_fresh(next, *b);
  // With room for one, no copy is kept: the same turn is prefilled whole.
  auto one = engine(1);
  ASSERT_TRUE(run(*one, params(first, 12, 51))->error.ok());
  EXPECT_EQ(run(*one, next)->fin.cached_tokens, 0u);
}

// Which prompts keep a copy of their state before the last token (EngineOptions::prefix_copy;
// taking it runs that token alone, a pass over the weights of its own). A turn that leaves the
// first prompt's tokens at its last one, and the same prompt again (a regenerated reply), are
// served by the copy where one was kept, else prefilled whole.
TEST_F(PrefixReuse, APromptKeepsACopyAsPrefixCopySays) {
  using Copy = EngineOptions::PrefixCopy;
  const std::optional<int32_t> think = tok_->find(tok::kTokThink);
  ASSERT_TRUE(think.has_value());
  const auto plain = tokens("A plain prompt with no chat format around it at all");
  for (const Copy mode : {Copy::kThink, Copy::kAll, Copy::kNone}) {
    for (const bool thinking : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "mode " << static_cast<int>(mode) << " thinking " << thinking);
      EngineOptions o;
      o.prefix_copy = mode;
      auto e = engine(2, o);
      const std::vector<int32_t> first = thinking ? cat(plain, {*think}) : plain;
      ASSERT_TRUE(run(*e, params(first, 6, 71))->error.ok());
      const bool copied = mode == Copy::kAll || (mode == Copy::kThink && thinking);
      const GenerateParams again = params(first, 6, 73);  // keeps a copy in turn, as the first did
      const auto b = run(*e, again);
      ASSERT_TRUE(b->error.ok()) << b->error;
      EXPECT_EQ(b->fin.cached_tokens, copied ? first.size() - 1 : 0u);
      expect_same_as_fresh(again, *b);
      std::vector<int32_t> left = first;
      left.back() = left.back() == 5 ? 6 : 5;
      const GenerateParams p = params(cat(left, tokens(" then")), 6, 72);
      const auto c = run(*e, p);
      ASSERT_TRUE(c->error.ok()) << c->error;
      EXPECT_EQ(c->fin.cached_tokens, copied ? first.size() - 1 : 0u);
      expect_same_as_fresh(p, *c);
    }
  }
}

// A cancelled request's state is whole up to the last token it ran, and is kept.
TEST_F(PrefixReuse, ACancelledRequestIsKeptUpToWhatItRan) {
  auto e = engine(1);
  const auto first = tokens("Count with me: one, two, three, four, five, six");
  const auto a = run(*e, params(first, 40, 31), 5);
  EXPECT_TRUE(absl::IsCancelled(a->error)) << a->error;
  ASSERT_EQ(a->ids.size(), 5u);
  const GenerateParams p = params(cat(cat(first, a->ids), tokens(" seven")), 10, 32);
  const auto b = run(*e, p);
  ASSERT_TRUE(b->error.ok()) << b->error;
  EXPECT_EQ(b->fin.cached_tokens, first.size() + 4);
  expect_same_as_fresh(p, *b);
}

// With two kept (plain prompts keep no copy), two conversations taking turns both continue.
TEST_F(PrefixReuse, TwoConversationsTakingTurnsBothContinue) {
  auto e = engine(2);
  const auto x = tokens("Conversation X begins here");
  const auto y = tokens("Conversation Y begins somewhere else entirely");
  const auto ax = run(*e, params(x, 5, 41));
  const auto ay = run(*e, params(y, 5, 42));
  ASSERT_TRUE(ax->error.ok() && ay->error.ok());
  const auto bx = run(*e, params(cat(cat(x, ax->ids), tokens(" more")), 5, 43));
  const auto by = run(*e, params(cat(cat(y, ay->ids), tokens(" more")), 5, 44));
  EXPECT_EQ(bx->fin.cached_tokens, x.size() + 4);
  EXPECT_EQ(by->fin.cached_tokens, y.size() + 4);
}

// The host memory floor (EngineOptions::min_mem_available), with MemAvailable given by the
// test: below it, the kept sequences go first; still below, the request fails naming it.
TEST_F(PrefixReuse, TheMemoryFloorFreesKeptSequencesThenRefuses) {
  std::mutex mu;
  std::vector<uint64_t> readings;  // what the next probes return, in order
  int probes = 0;
  EngineOptions o;
  o.min_mem_available = 4ull << 30;
  o.mem_available = [&]() -> StatusOr<uint64_t> {
    std::lock_guard<std::mutex> l(mu);
    const uint64_t v = readings.at(static_cast<size_t>(probes++));
    return v;
  };
  auto feed = [&](std::initializer_list<uint64_t> v) {
    std::lock_guard<std::mutex> l(mu);
    readings.insert(readings.end(), v);
  };
  auto e = engine(2, o);
  const auto first = tokens("Memory is shared by the CPU and the GPU on this machine");
  feed({8ull << 30});
  const auto a = run(*e, params(first, 6, 61));
  ASSERT_TRUE(a->error.ok()) << a->error;
  const GenerateParams next = params(cat(cat(first, a->ids), tokens(" again")), 4, 62);
  // Short, and still short once the kept sequences are freed: refused, naming the floor.
  feed({1ull << 30, 1ull << 30});
  const auto refused = run(*e, next);
  EXPECT_EQ(refused->error.code(), absl::StatusCode::kResourceExhausted) << refused->error;
  EXPECT_NE(refused->error.message().find("--min-mem-available"), std::string::npos) << refused->error;
  EXPECT_EQ(probes, 3);
  // Enough again: it runs, prefilled whole (nothing was kept).
  feed({8ull << 30});
  const auto after = run(*e, next);
  ASSERT_TRUE(after->error.ok()) << after->error;
  EXPECT_EQ(after->fin.cached_tokens, 0u);
  // Short until the kept sequences are freed: it runs, without them.
  const GenerateParams third = params(cat(cat(next.prompt, after->ids), tokens(" more")), 4, 63);
  feed({1ull << 30, 8ull << 30});
  const auto freed = run(*e, third);
  ASSERT_TRUE(freed->error.ok()) << freed->error;
  EXPECT_EQ(freed->fin.cached_tokens, 0u);
  EXPECT_EQ(probes, 6);
  // A MemAvailable that cannot be read fails the request with the reason.
  EngineOptions broken;
  broken.min_mem_available = 1;
  broken.mem_available = []() -> StatusOr<uint64_t> { return absl::NotFoundError("cannot read /proc/meminfo"); };
  auto e3 = engine(2, broken);
  const auto r = run(*e3, params(first, 2, 64));
  EXPECT_EQ(r->error.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(r->error.message().find("memory floor"), std::string::npos) << r->error;
}

}  // namespace
}  // namespace dsflash::engine
