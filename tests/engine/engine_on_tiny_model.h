// An engine on the tiny synthetic model (CPU backend) for the engine's tests: a stream that
// collects a request's events, and requests run against an engine and against a fresh one
// that keeps nothing, with which the tokens and log-probabilities must agree bit for bit.
#pragma once

#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "common/gguf/gguf.h"
#include "gtest/gtest.h"
#include "inference_svc/engine/engine.h"
#include "tests/test_util.h"
#include "tools/dsflash/synth_model.h"

namespace dsflash::engine {

// Collects a request's events; `done` is set once it ended.
struct Collector : Stream {
  std::vector<int32_t> ids;
  std::vector<TokenLogprob> logprobs;
  FinalEvent fin;
  Status error;
  size_t cancel_after = 0;  // cancels once this many tokens came (0: never)
  std::promise<void> done;
  std::function<void()> on_each;  // called on every tokens event (from the scheduler thread)
  void on_tokens(TokensEvent e) override {
    if (on_each) on_each();
    ids.insert(ids.end(), e.ids.begin(), e.ids.end());
    logprobs.insert(logprobs.end(), e.logprobs.begin(), e.logprobs.end());
  }
  void on_final(FinalEvent e) override {
    fin = std::move(e);
    done.set_value();
  }
  void on_error(Status s) override {
    error = std::move(s);
    done.set_value();
  }
  bool cancelled() const override { return cancel_after > 0 && ids.size() >= cancel_after; }
};

class EngineOnTinyModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    const std::string path = dir_->file("tiny.gguf");
    ASSERT_TRUE(tools::write_synthetic_model(tools::SynthOptions{}, path, 1).ok());
    file_ = std::move(*gguf::Model::open(path)).release();
    model_ = std::move(*model::Model::load(*file_)).release();
    tok_ = std::move(*tok::Tokenizer::from_gguf(*file_)).release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete model_;
    delete file_;
    delete dir_;
  }

  static std::unique_ptr<Engine> engine(size_t kept, EngineOptions o = {}) {
    o.prefix_cache = kept;
    o.prefill_chunk = 7;  // chunks that straddle the kept prefix's end
    return std::make_unique<Engine>(*model_, *tok_, nullptr, o);
  }
  static GenerateParams params(std::vector<int32_t> prompt, uint32_t n, uint64_t seed) {
    GenerateParams p;
    p.prompt = std::move(prompt);
    p.sampling.temperature = 0.9f;
    p.sampling.seed = seed;
    p.seed_given = true;
    p.stop.max_new_tokens = n;
    p.stop.ignore_eos = true;
    p.output.logprobs = true;
    p.output.top_logprobs = 3;
    return p;
  }
  // Submits a request; the collector's `done` is set once it ended.
  static std::shared_ptr<Collector> submit(Engine& e, GenerateParams p, size_t cancel_after = 0) {
    auto c = std::make_shared<Collector>();
    c->cancel_after = cancel_after;
    EXPECT_TRUE(e.validate(p).ok());
    EXPECT_TRUE(e.submit(std::move(p), c).ok());
    return c;
  }
  static std::shared_ptr<Collector> run(Engine& e, GenerateParams p, size_t cancel_after = 0) {
    auto c = submit(e, std::move(p), cancel_after);
    c->done.get_future().wait();
    return c;
  }
  static std::vector<int32_t> tokens(const std::string& text) { return *tok_->encode(text); }
  static std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }
  // The same request on an engine that keeps nothing.
  static void expect_same_as_fresh(const GenerateParams& p, const Collector& got) {
    EngineOptions one;
    one.max_running = 1;
    auto fresh = engine(0, one);
    const auto want = run(*fresh, p);
    ASSERT_TRUE(want->error.ok()) << want->error;
    EXPECT_EQ(want->fin.cached_tokens, 0u);
    EXPECT_EQ(got.ids, want->ids);
    ASSERT_EQ(got.logprobs.size(), want->logprobs.size());
    for (size_t i = 0; i < got.logprobs.size(); ++i) {
      EXPECT_EQ(got.logprobs[i].logprob, want->logprobs[i].logprob) << i;
      EXPECT_EQ(got.logprobs[i].top_ids, want->logprobs[i].top_ids) << i;
      EXPECT_EQ(got.logprobs[i].top_logprobs, want->logprobs[i].top_logprobs) << i;
    }
  }

  static inline testing::TempDir* dir_ = nullptr;
  static inline gguf::Model* file_ = nullptr;
  static inline model::Model* model_ = nullptr;
  static inline tok::Tokenizer* tok_ = nullptr;
};

}  // namespace dsflash::engine
