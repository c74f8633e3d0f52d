// The engine under concurrent use (also the ThreadSanitizer target of the scheduler): many
// threads submit, cancel and abort at once; every admitted request ends with exactly one
// terminal event (final or error) and nothing after it; refused ones get no event at all.
#include <atomic>
#include <random>
#include <thread>

#include "common/gguf/gguf.h"
#include "gtest/gtest.h"
#include "inference_svc/engine/engine.h"
#include "tests/test_util.h"
#include "tools/dsflash/synth_model.h"

namespace dsflash::engine {
namespace {

struct Recorder : Stream {
  std::atomic<int> tokens{0}, finals{0}, errors{0}, after_end{0};
  std::atomic<bool> cancel{false};
  void on_tokens(TokensEvent) override {
    if (finals + errors > 0) ++after_end;
    ++tokens;
  }
  void on_final(FinalEvent) override {
    if (finals + errors > 0) ++after_end;
    ++finals;
  }
  void on_error(Status) override {
    if (finals + errors > 0) ++after_end;
    ++errors;
  }
  bool cancelled() const override { return cancel; }
};

struct World {
  testing::TempDir dir;
  std::unique_ptr<gguf::Model> file;
  std::unique_ptr<model::Model> model;
  std::unique_ptr<tok::Tokenizer> tok;
  World() {
    const std::string path = dir.file("tiny.gguf");
    EXPECT_TRUE(tools::write_synthetic_model(tools::SynthOptions{}, path, 1).ok());
    file = std::move(*gguf::Model::open(path));
    model = std::move(*model::Model::load(*file));
    tok = std::move(*tok::Tokenizer::from_gguf(*file));
  }
};

TEST(EngineConcurrency, EveryAdmittedRequestEndsOnceUnderConcurrentSubmitCancelAbort) {
  World w;
  EngineOptions opt;
  opt.max_queue = 4;
  Engine engine(*w.model, *w.tok, nullptr, opt);
  std::vector<std::shared_ptr<Recorder>> admitted, refused;
  std::mutex mu;
  auto submitter = [&](int seed) {
    std::mt19937 rng(seed);
    for (int i = 0; i < 12; ++i) {
      GenerateParams p;
      p.request_id = "r" + std::to_string(seed) + "-" + std::to_string(i);
      p.prompt = *w.tok->encode("Hello there number " + std::to_string(i));
      p.stop.max_new_tokens = 1 + rng() % 4;
      p.stop.ignore_eos = true;
      if (!engine.validate(p).ok()) continue;
      auto r = std::make_shared<Recorder>();
      if (rng() % 4 == 0) r->cancel = true;  // client already gone
      const Status s = engine.submit(std::move(p), r);
      std::lock_guard<std::mutex> l(mu);
      (s.ok() ? admitted : refused).push_back(r);
      if (!s.ok()) {
        EXPECT_TRUE(absl::IsResourceExhausted(s) || absl::IsUnavailable(s)) << s;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(submitter, t + 1);
  std::thread canceller([&] {  // cancels running requests from outside
    for (int i = 0; i < 50; ++i) {
      {
        std::lock_guard<std::mutex> l(mu);
        if (!admitted.empty()) admitted[static_cast<size_t>(i) % admitted.size()]->cancel = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  for (auto& t : threads) t.join();
  canceller.join();
  engine.drain();
  engine.abort_all(absl::UnavailableError("test shutdown"));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (engine.in_flight() > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(engine.in_flight(), 0u);
  std::lock_guard<std::mutex> l(mu);
  EXPECT_GT(admitted.size(), 0u);
  for (const auto& r : admitted) {
    EXPECT_EQ(r->finals + r->errors, 1) << "finals " << r->finals << " errors " << r->errors;
    EXPECT_EQ(r->after_end, 0);
  }
  for (const auto& r : refused) EXPECT_EQ(r->tokens + r->finals + r->errors, 0);
  // After draining, new work is refused.
  GenerateParams p;
  p.prompt = *w.tok->encode("late");
  ASSERT_TRUE(engine.validate(p).ok());
  EXPECT_TRUE(absl::IsUnavailable(engine.submit(std::move(p), std::make_shared<Recorder>())));
}

}  // namespace
}  // namespace dsflash::engine
