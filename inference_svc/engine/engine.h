// The generation engine: a bounded admission queue and one scheduler thread that owns every
// sequence's state, runs prefill then decode step by step, samples, detokenises (never
// splitting a UTF-8 character), matches stop strings and token ids, and reports to a Stream.
// Up to max_running requests run at once, each on its own sequence, taking turns: a turn is
// one prefill chunk or one decode step (with its token sent), so a new request's first token
// waits for one turn of each running request, not for their whole replies. Each sequence runs
// alone on the model (no batching), so the tokens are those of the request run by itself.
// Cancellation and deadlines are checked on every turn; a finished, cancelled or expired
// request's sequence is kept for prefix reuse (prefix_cache.h) or freed at once.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/tokenizer.h"
#include "inference_svc/engine/metrics.h"
#include "inference_svc/engine/prefix_cache.h"
#include "inference_svc/engine/sampler.h"
#include "inference_svc/model/model.h"

namespace dsflash::engine {

enum class FinishReason { kLength, kEos, kStopSequence, kStopToken };
const char* finish_reason_name(FinishReason r);

struct StopParams {
  uint32_t max_new_tokens = 0;  // 0: the server default
  uint32_t min_new_tokens = 0;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool include_stop_in_output = false;
};

struct OutputParams {
  bool logprobs = false;
  uint32_t top_logprobs = 0;
  bool skip_special_tokens = true;
};

using Clock = std::chrono::steady_clock;

struct GenerateParams {
  std::string request_id;
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  bool seed_given = false;
  StopParams stop;
  OutputParams output;
  Clock::time_point deadline = Clock::time_point::max();
};

struct TokensEvent {
  std::vector<int32_t> ids;
  std::string text;  // complete UTF-8 characters only
  std::vector<TokenLogprob> logprobs;
};

struct FinalEvent {
  FinishReason reason = FinishReason::kLength;
  std::string matched_stop;
  uint32_t prompt_tokens = 0, completion_tokens = 0;
  uint32_t cached_tokens = 0;  // prompt tokens a kept sequence already held (not prefilled again)
  double queue_s = 0, ttft_s = 0, e2e_s = 0;
  uint64_t seed = 0;
};

// Receives a request's events, from the scheduler thread. Exactly one of on_final / on_error
// ends a request. Implementations must not block.
class Stream {
 public:
  virtual ~Stream() = default;
  virtual void on_tokens(TokensEvent e) = 0;
  virtual void on_final(FinalEvent e) = 0;
  virtual void on_error(Status s) = 0;
  virtual bool cancelled() const = 0;
};

struct EngineOptions {
  size_t max_queue = 16;                // waiting requests beyond the running ones
  // Requests running at once, taking turns on the model (each on a sequence of its own, whose
  // caches hold memory); 1: one after another. A request that finds no memory for a new
  // sequence beside the running ones waits in the queue until one ends.
  size_t max_running = 4;
  uint32_t default_max_new_tokens = 256;
  uint32_t max_stop_strings = 16;
  uint32_t max_stop_bytes = 256;
  uint32_t max_top_logprobs = 20;
  uint32_t prefill_chunk = 256;          // prompt tokens per model call (cancellation is checked between)
  // CUDA backend: tokens are drawn on the device (Model::forward_draw) unless the request asks
  // for logprobs, which need the logits on the host. Off: every draw on the host (measurement).
  bool device_sampling = true;
  // Sequences kept after their requests for prefix reuse (prefix_cache.h): a prompt that
  // continues a kept sequence's tokens is prefilled from where they end. With room for two, a
  // prompt may also keep a copy of its state before its last token (prefix_copy). 0: none
  // kept. The running requests' sequences count against it: at most prefix_cache sequences
  // are kept or running at once (running ones beyond it leave none kept). On the CPU backend
  // the logits equal a whole prefill's bit for bit; on the CUDA backend the kept part was
  // computed by decode steps, whose GEMVs round differently from the prefill's GEMMs (within
  // the golden bounds either way).
  size_t prefix_cache = 2;
  // Which prompts keep that copy. Taking it runs the prompt's last token alone (a pass over the
  // weights of its own, a decode step's time) and copies the caches; it serves a next turn
  // that leaves the kept tokens at that last token, and a request for the same prompt again.
  // kThink: prompts ending with <think>, thinking mode's generation prompt (its chat format
  // renders an earlier reply without its reasoning, </think>answer where <think> stood, so the
  // next turn leaves the kept tokens right there). kAll: every prompt (also a regenerated
  // reply's prompt). kNone: no copies.
  enum class PrefixCopy { kThink, kAll, kNone };
  PrefixCopy prefix_copy = PrefixCopy::kThink;
  // Host memory floor (spec/serving.md §6.6; on GB10 the GPU allocates from the same memory):
  // a request about to start with MemAvailable below it first frees the kept sequences, then,
  // still below, fails with RESOURCE_EXHAUSTED instead of growing toward the OOM killer. 0: off.
  uint64_t min_mem_available = 0;
  // Where MemAvailable comes from: /proc/meminfo unless set (tests set it).
  std::function<StatusOr<uint64_t>()> mem_available;
};

class Engine {
 public:
  Engine(const model::Model& model, const tok::Tokenizer& tok, Metrics* metrics, EngineOptions options);
  ~Engine();

  // Checks a request and fills defaults (max_new_tokens, seed). INVALID_ARGUMENT names the field.
  Status validate(GenerateParams& p) const;
  // Queues a validated request. RESOURCE_EXHAUSTED when the queue is full, UNAVAILABLE when
  // draining. On success the stream will get its events.
  Status submit(GenerateParams p, std::shared_ptr<Stream> stream);
  // Stops admitting; requests already admitted run to completion.
  void drain();
  bool draining() const { return draining_; }
  // Fails every queued and running request with `s` (shutdown after the grace period).
  void abort_all(const Status& s);
  // Admitted requests not yet finished.
  size_t in_flight() const;
  const EngineOptions& options() const { return opt_; }

 private:
  struct Job {
    GenerateParams p;
    std::shared_ptr<Stream> stream;
    Clock::time_point admitted;
  };
  struct Run;  // one request on its sequence, turn by turn (engine.cc)
  void loop();
  // Jobs from the queue into `starting` while fewer than `limit` run (waits while nothing
  // runs or waits); false once the engine stops with nothing left to run.
  bool admit(std::vector<Job>& starting, size_t running, size_t limit);
  // A job's run: its memory check and its sequence. nullptr (the job left as it was) when no
  // new sequence fits beside the `running` ones; the job waits for one to end.
  StatusOr<std::unique_ptr<Run>> start(Job& job, size_t running);
  // Ends a run: its sequence kept (prefix_cache.h), then its final event or error.
  void finish(Run& r, const Status& s);
  // The state a request runs on: a kept sequence whose tokens begin its prompt, else a new one
  // (nullptr seq: no memory for one beside the `running` ones).
  StatusOr<PrefixCache::Entry> sequence_for(const std::vector<int32_t>& prompt, size_t running);
  // The memory floor's check (EngineOptions::min_mem_available) before a request starts.
  Status check_memory();
  // Whether a request keeps a copy of its state before its prompt's last token (prefix_copy).
  bool keeps_copy(const std::vector<int32_t>& prompt) const;

  const model::Model& model_;
  const tok::Tokenizer& tok_;
  Metrics* metrics_;
  EngineOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  size_t running_ = 0;  // requests started and not yet ended
  bool stop_ = false;
  std::atomic<bool> draining_{false};
  // abort_all: runs started before it (an older generation) fail with abort_status_.
  std::atomic<uint64_t> abort_gen_{0};
  Status abort_status_;
  std::vector<std::unique_ptr<Run>> runs_;  // running, in the order they started (the scheduler thread's)
  const std::optional<int32_t> think_;  // the vocabulary's <think> (a thinking-mode prompt's last token)
  PrefixCache cache_;                    // the scheduler thread's
  std::thread thread_;
};

}  // namespace dsflash::engine
