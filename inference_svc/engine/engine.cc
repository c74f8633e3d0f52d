// Scheduler thread and the generation loop (see engine.h).
#include "inference_svc/engine/engine.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/host/host.h"
#include "common/log.h"
#include "inference_svc/engine/stop_matcher.h"

namespace dsflash::engine {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

Status invalid(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kLength: return "length";
    case FinishReason::kEos: return "eos";
    case FinishReason::kStopSequence: return "stop_sequence";
    case FinishReason::kStopToken: return "stop_token";
  }
  return "?";
}

Status Engine::validate(GenerateParams& p) const {
  const int64_t V = model_.config().n_vocab, ctx = model_.config().n_ctx;
  if (p.prompt.empty()) return invalid("prompt", "empty: give prompt text, token ids or chat messages");
  for (size_t i = 0; i < p.prompt.size(); ++i) {
    if (p.prompt[i] < 0 || p.prompt[i] >= V) {
      return invalid("prompt_token_ids", absl::StrCat("id ", p.prompt[i], " at ", i, " is outside the vocabulary (", V, ")"));
    }
  }
  const int64_t room = ctx - static_cast<int64_t>(p.prompt.size());
  if (room < 1) {
    return invalid("prompt", absl::StrCat(p.prompt.size(), " tokens leave no room in the context of ", ctx));
  }
  StopParams& s = p.stop;
  if (s.max_new_tokens == 0) s.max_new_tokens = static_cast<uint32_t>(std::min<int64_t>(opt_.default_max_new_tokens, room));
  if (s.max_new_tokens > room) {
    return invalid("stopping.max_new_tokens", absl::StrCat("prompt (", p.prompt.size(), " tokens) + ", s.max_new_tokens,
                                                           " exceeds the context of ", ctx));
  }
  if (s.min_new_tokens > s.max_new_tokens) return invalid("stopping.min_new_tokens", "greater than max_new_tokens");
  if (s.stop.size() > opt_.max_stop_strings) return invalid("stopping.stop", absl::StrCat("more than ", opt_.max_stop_strings, " strings"));
  for (const auto& st : s.stop) {
    if (st.empty() || st.size() > opt_.max_stop_bytes) {
      return invalid("stopping.stop", absl::StrCat("each stop string needs 1..", opt_.max_stop_bytes, " bytes"));
    }
  }
  for (int32_t t : s.stop_token_ids) {
    if (t < 0 || t >= V) return invalid("stopping.stop_token_ids", absl::StrCat("id ", t, " is outside the vocabulary"));
  }
  const SamplingParams& q = p.sampling;
  if (!std::isfinite(q.temperature) || q.temperature < 0) return invalid("sampling.temperature", "must be >= 0");
  if (!(q.top_p > 0 && q.top_p <= 1)) return invalid("sampling.top_p", "must be in (0, 1]");
  if (q.top_k < 0) return invalid("sampling.top_k", "must be >= 0");
  if (!(q.min_p >= 0 && q.min_p <= 1)) return invalid("sampling.min_p", "must be in [0, 1]");
  if (!(q.repetition_penalty > 0) || !std::isfinite(q.repetition_penalty)) {
    return invalid("sampling.repetition_penalty", "must be > 0");
  }
  if (!std::isfinite(q.presence_penalty) || !std::isfinite(q.frequency_penalty)) {
    return invalid("sampling", "penalties must be finite");
  }
  if (p.output.top_logprobs > opt_.max_top_logprobs) {
    return invalid("output.top_logprobs", absl::StrCat("at most ", opt_.max_top_logprobs));
  }
  if (!p.seed_given) {
    std::random_device rd;
    p.sampling.seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  return absl::OkStatus();
}

Status Engine::submit(GenerateParams p, std::shared_ptr<Stream> stream) {
  std::lock_guard<std::mutex> l(mu_);
  if (draining_ || stop_) {
    if (metrics_) metrics_->rejected("draining");
    return absl::UnavailableError("the server is draining and admits no new requests");
  }
  if (queue_.size() >= opt_.max_queue) {
    if (metrics_) metrics_->rejected("queue_full");
    return absl::ResourceExhaustedError(absl::StrCat("admission queue full (", opt_.max_queue, " waiting); retry later"));
  }
  queue_.push_back(Job{std::move(p), std::move(stream), Clock::now()});
  if (metrics_) metrics_->waiting->Set(static_cast<double>(queue_.size()));
  cv_.notify_one();
  return absl::OkStatus();
}

void Engine::drain() { draining_ = true; }

size_t Engine::in_flight() const {
  std::lock_guard<std::mutex> l(mu_);
  return queue_.size() + running_;
}

void Engine::abort_all(const Status& s) {
  std::deque<Job> dropped;
  {
    std::lock_guard<std::mutex> l(mu_);
    abort_status_ = s;
    ++abort_gen_;
    dropped.swap(queue_);
    if (metrics_) metrics_->waiting->Set(0);
  }
  for (Job& j : dropped) j.stream->on_error(s);
}

namespace {

// Per-request output state: sampling, stop conditions (EOS, stop ids, stop strings, length)
// and UTF-8-safe text assembly.
class Output {
 public:
  Output(const GenerateParams& p, const tok::Tokenizer& tok)
      : p_(p), tok_(tok), sampler_(p.sampling), detok_(tok, p.output.skip_special_tokens),
        stops_(p.stop.stop, p.stop.include_stop_in_output) {}

  // Samples the next token from `logits` (host) into `ev`; true when the generation ends (with
  // fin.reason / fin.matched_stop set). room: positions left in the context for the token.
  StatusOr<bool> step(std::vector<float>& logits, int64_t room, TokensEvent& ev, FinalEvent& fin) {
    for (int32_t t : banned()) logits[t] = -INFINITY;
    std::vector<float> raw;
    if (p_.output.logprobs) raw = logits;  // before sampling penalties
    const int32_t token = sampler_.sample(logits, generated_);
    if (p_.output.logprobs) ev.logprobs.push_back(Sampler::logprobs(raw, token, p_.output.top_logprobs));
    return accept(token, room, ev, fin);
  }
  // The next draw made on the device instead (the same edits, filters and seeded uniform).
  model::DeviceDraw device_draw() {
    model::DeviceDraw d;
    d.params = sampler_.params();
    d.penalties = sampler_.penalties();
    d.edits = kernels::sample::make_edits(generated_, banned(), d.penalties);
    d.u01 = sampler_.next_uniform();
    d.top_logprobs = p_.output.logprobs ? static_cast<int>(p_.output.top_logprobs) : -1;
    return d;
  }
  // Takes a device draw into `ev`: its log-probabilities where asked for (device_draw), then
  // the token as step() does after its draw.
  StatusOr<bool> accept_drawn(int32_t token, const kernels::sample::DrawLogprobs& lp, int64_t room, TokensEvent& ev,
                              FinalEvent& fin) {
    if (p_.output.logprobs) ev.logprobs.push_back(Sampler::logprobs(token, lp));
    return accept(token, room, ev, fin);
  }
  // Takes the drawn token into `ev`: as step() after its draw.
  StatusOr<bool> accept(int32_t token, int64_t room, TokensEvent& ev, FinalEvent& fin) {
    const bool may_stop = generated_.size() >= p_.stop.min_new_tokens;
    generated_.push_back(token);
    ev.ids.push_back(token);
    bool done = false;
    const auto& ids = p_.stop.stop_token_ids;
    if (token == tok_.eos() && !p_.stop.ignore_eos) {
      fin.reason = FinishReason::kEos;
      done = true;
    } else if (std::find(ids.begin(), ids.end(), token) != ids.end()) {
      fin.reason = FinishReason::kStopToken;
      done = true;
    } else {
      ASSIGN_OR_RETURN(std::string text, detok_.push(token));
      auto out = stops_.push(text, may_stop);
      ev.text = std::move(out.text);
      if (out.match) {
        fin.reason = FinishReason::kStopSequence;
        fin.matched_stop = *out.match;
        return true;
      }
    }
    if (!done && (generated_.size() >= p_.stop.max_new_tokens || room < 1)) {
      fin.reason = FinishReason::kLength;
      done = true;
    }
    if (done) ev.text += stops_.push(detok_.flush(), false).text + stops_.flush();
    return done;
  }
  size_t n_generated() const { return generated_.size(); }

 private:
  // Ids that may not come next: EOS and the stop ids before min_new_tokens.
  std::vector<int32_t> banned() const {
    if (generated_.size() >= p_.stop.min_new_tokens) return {};
    std::vector<int32_t> ids = p_.stop.stop_token_ids;
    if (!p_.stop.ignore_eos && tok_.eos() >= 0) ids.push_back(tok_.eos());
    return ids;
  }

  const GenerateParams& p_;
  const tok::Tokenizer& tok_;
  Sampler sampler_;
  tok::Detokenizer detok_;
  StopMatcher stops_;
  std::vector<int32_t> generated_;
};

}  // namespace

Status Engine::check_memory() {
  if (opt_.min_mem_available == 0) return absl::OkStatus();
  StatusOr<uint64_t> avail = opt_.mem_available();
  if (avail.ok() && *avail < opt_.min_mem_available && cache_.size() > 0) {
    log::warn("host memory: %.0f MiB available, below the floor of %.0f MiB: freeing %zu kept sequence(s)",
              *avail / 1048576.0, opt_.min_mem_available / 1048576.0, cache_.size());
    cache_.clear();
    if (metrics_) metrics_->prefix_cache_tokens->Set(0);
    // The device pools keep what the sequences freed for reuse; on GB10 that memory is the
    // host's, so it goes back to the driver before MemAvailable is read again.
    if (const Status r = model_.release_memory(); !r.ok()) {
      log::warn("host memory: the freed sequences' device memory was not given back: %s", std::string(r.message()));
    }
    avail = opt_.mem_available();
  }
  if (!avail.ok()) {
    return absl::Status(avail.status().code(),
                        absl::StrCat("checking the host memory floor: ", avail.status().message()));
  }
  if (*avail >= opt_.min_mem_available) return absl::OkStatus();
  if (metrics_) metrics_->rejected("memory");
  return absl::ResourceExhaustedError(absl::StrCat("host memory: ", *avail >> 20, " MiB available, below the floor of ",
                                                   opt_.min_mem_available >> 20,
                                                   " MiB (--min-mem-available); retry later"));
}

StatusOr<PrefixCache::Entry> Engine::sequence_for(const std::vector<int32_t>& prompt, size_t running) {
  std::optional<PrefixCache::Entry> hit = cache_.take(prompt, running);
  if (metrics_ && cache_.capacity() > 0) metrics_->prefix_lookup(hit.has_value())->Increment();
  if (hit) return std::move(*hit);
  PrefixCache::Entry e;
  e.seq = model_.new_sequence();
  while (e.seq == nullptr && cache_.drop_oldest()) e.seq = model_.new_sequence();
  return e;
}

bool Engine::keeps_copy(const std::vector<int32_t>& prompt) const {
  // Room for both, and a token before the last. A prompt whose kept state already ends there
  // (a copy served it) copies that state again, so that it serves the next request in turn.
  if (cache_.capacity() < 2 || prompt.size() < 2) return false;
  switch (opt_.prefix_copy) {
    case EngineOptions::PrefixCopy::kThink:
      return think_ && prompt.back() == *think_;
    case EngineOptions::PrefixCopy::kAll:
      return true;
    case EngineOptions::PrefixCopy::kNone:
      return false;
  }
  return false;
}

// One request on its sequence, turn by turn: the model calls (each appends what it ran to the
// state's tokens; after a failed one the state is unknown and is not kept), the checks before
// each, and where the next token comes from. On the CUDA backend it is drawn on the device
// after the prompt's last chunk and every decode step, with its log-probabilities where asked.
// A prompt that keeps a copy (keeps_copy) runs its last token alone, after the copy of the
// state before it is taken.
struct Engine::Run {
  Run(Engine& engine, Job j, PrefixCache::Entry s, Clock::time_point start)
      : e(engine), job(std::move(j)), state(std::move(s)), out(job.p, engine.tok_),
        on_device(engine.opt_.device_sampling && engine.model_.draws_on_device()),
        gen(engine.abort_gen_.load()), started(start), fed(state.tokens.size()),
        copy(engine.keeps_copy(job.p.prompt)), split(copy ? job.p.prompt.size() - 1 : job.p.prompt.size()) {}

  // One turn: the next prefill chunk (--prefill-chunk tokens, up to the copy's split), or the
  // last token drawn; after the prompt's last chunk and after every decode step, the next
  // token is drawn and sent. True when the request has ended (fin filled in).
  StatusOr<bool> step() {
    const std::vector<int32_t>& prompt = job.p.prompt;
    if (fed < prompt.size()) {
      if (copy && !copied && fed == split) copy_state();
      const size_t chunk = std::max<uint32_t>(1, e.opt_.prefill_chunk);
      const size_t end = std::min(fed + chunk, copy && fed < split ? split : prompt.size());
      RETURN_IF_ERROR(call(std::vector<int32_t>(prompt.begin() + fed, prompt.begin() + end), end == prompt.size()));
      fed = end;
      if (fed < prompt.size()) return false;
      prefill_done = Clock::now();
      if (e.metrics_) e.metrics_->prefill_time->Observe(seconds(prefill_done - started));
    } else {
      RETURN_IF_ERROR(call({next}, true));
    }
    return draw();
  }

  // The next token from the last call's logits (or its device draw), sent to the stream.
  StatusOr<bool> draw() {
    TokensEvent ev;
    const int64_t room = e.model_.config().n_ctx - state.seq->n_past;
    ASSIGN_OR_RETURN(const bool done, on_device ? out.accept_drawn(drawn, drawn_logprobs, room, ev, fin)
                                                : out.step(logits, room, ev, fin));
    next = ev.ids.back();
    const auto now = Clock::now();
    const bool first = out.n_generated() == 1;
    if (first) fin.ttft_s = seconds(now - job.admitted);
    if (e.metrics_) {
      e.metrics_->generation_tokens->Increment();
      (first ? e.metrics_->ttft : e.metrics_->inter_token)->Observe(seconds(now - (first ? job.admitted : last_token)));
    }
    last_token = now;
    job.stream->on_tokens(std::move(ev));
    if (done) {
      fin.completion_tokens = static_cast<uint32_t>(out.n_generated());
      fin.e2e_s = seconds(now - job.admitted);
      if (e.metrics_) e.metrics_->decode_time->Observe(seconds(now - prefill_done));
    }
    return done;
  }

  Status check() const {
    if (job.stream->cancelled()) return absl::CancelledError("the client cancelled the request");
    if (Clock::now() > job.p.deadline) return absl::DeadlineExceededError("the request deadline passed");
    if (e.abort_gen_.load() != gen) {
      std::lock_guard<std::mutex> l(e.mu_);
      return e.abort_status_;
    }
    return absl::OkStatus();
  }
  Status call(const std::vector<int32_t>& tokens, bool last) {
    RETURN_IF_ERROR(check());
    model::Sequence& seq = *state.seq;
    const Status s = last && on_device ? e.model_.forward_draw(seq, tokens, out.device_draw(), &drawn, &drawn_logprobs)
                                       : e.model_.forward(seq, tokens, false, &logits);
    if (s.ok()) state.tokens.insert(state.tokens.end(), tokens.begin(), tokens.end());
    intact = intact && s.ok();
    return s;
  }
  // A copy of the state so far, kept with it afterwards (room made for the running sequences
  // and the copy first).
  void copy_state() {
    copied = true;
    e.cache_.reserve(e.runs_.size() + 1);
    auto c = e.model_.copy_sequence(*state.seq);
    if (!c.ok()) {
      log::warn("prefix cache: no copy of the prompt's state: %s", std::string(c.status().message()));
      return;
    }
    checkpoint = PrefixCache::Entry{std::move(*c), state.tokens};
  }
  // Into the cache: the copy, then the state (the more recent) unless a call failed; then no
  // more kept than leaves room for the runs still going.
  void keep() {
    if (checkpoint) e.cache_.put(std::move(*checkpoint));
    if (intact) e.cache_.put(std::move(state));
    e.cache_.reserve(e.runs_.size() - 1);
    if (e.metrics_) e.metrics_->prefix_cache_tokens->Set(static_cast<double>(e.cache_.tokens()));
  }

  Engine& e;
  Job job;
  PrefixCache::Entry state;
  std::optional<PrefixCache::Entry> checkpoint;
  bool intact = true;
  Output out;
  const bool on_device;
  const uint64_t gen;  // abort_gen_ when it started
  std::vector<float> logits;
  int32_t drawn = -1;  // the device's draw
  kernels::sample::DrawLogprobs drawn_logprobs;  // and its log-probabilities (where asked)
  int32_t next = -1;   // the token drawn last, to run next
  FinalEvent fin;
  const Clock::time_point started;
  Clock::time_point prefill_done, last_token;
  size_t fed;  // prompt tokens the state holds
  const bool copy;
  bool copied = false;
  const size_t split;  // where the copy is taken
};

StatusOr<std::unique_ptr<Engine::Run>> Engine::start(Job& job, size_t running) {
  const GenerateParams& p = job.p;
  const auto now = Clock::now();
  RETURN_IF_ERROR(check_memory());
  ASSIGN_OR_RETURN(PrefixCache::Entry state, sequence_for(p.prompt, running));
  if (state.seq == nullptr) return nullptr;
  FinalEvent fin;
  fin.queue_s = seconds(now - job.admitted);
  fin.prompt_tokens = static_cast<uint32_t>(p.prompt.size());
  fin.seed = p.sampling.seed;
  fin.cached_tokens = static_cast<uint32_t>(state.tokens.size());
  if (metrics_) {
    metrics_->queue_time->Observe(fin.queue_s);
    metrics_->prompt_tokens->Increment(static_cast<double>(p.prompt.size()));
    metrics_->prompt_tokens_hist->Observe(static_cast<double>(p.prompt.size()));
    metrics_->prompt_tokens_cached->Increment(fin.cached_tokens);
  }
  auto r = std::make_unique<Run>(*this, std::move(job), std::move(state), now);
  r->fin = fin;
  return r;
}

void Engine::finish(Run& r, const Status& s) {
  r.keep();
  if (!s.ok()) {
    r.job.stream->on_error(s);
    return;
  }
  if (metrics_) {
    metrics_->finished(finish_reason_name(r.fin.reason));
    metrics_->e2e->Observe(r.fin.e2e_s);
    metrics_->generation_tokens_hist->Observe(r.fin.completion_tokens);
  }
  r.job.stream->on_final(std::move(r.fin));
}

bool Engine::admit(std::vector<Job>& starting, size_t running, size_t limit) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return stop_ || !queue_.empty() || running > 0; });
  if (stop_ && queue_.empty() && running == 0) return false;
  while (running + starting.size() < limit && !queue_.empty()) {
    starting.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  running_ = running + starting.size();
  if (metrics_) {
    metrics_->waiting->Set(static_cast<double>(queue_.size()));
    metrics_->running->Set(static_cast<double>(running_));
  }
  return true;
}

// The scheduler: admits what fits, then gives every running request one turn, in the order
// they started.
void Engine::loop() {
  bool full = false;  // a sequence did not fit beside the running ones: none starts until one ends
  for (;;) {
    std::vector<Job> starting;
    if (!admit(starting, runs_.size(), full ? runs_.size() : std::max<size_t>(1, opt_.max_running))) return;
    for (size_t i = 0; i < starting.size(); ++i) {
      StatusOr<std::unique_ptr<Run>> r = start(starting[i], runs_.size());
      if (r.ok() && *r == nullptr && !runs_.empty()) {  // back to the queue's front
        std::lock_guard<std::mutex> l(mu_);
        for (size_t j = starting.size(); j > i; --j) queue_.push_front(std::move(starting[j - 1]));
        full = true;
        break;
      }
      if (r.ok() && *r == nullptr) r = absl::ResourceExhaustedError("no device memory for a new sequence");
      if (r.ok()) {
        runs_.push_back(std::move(*r));
      } else {
        starting[i].stream->on_error(r.status());
      }
    }
    for (size_t i = 0; i < runs_.size();) {
      StatusOr<bool> done = runs_[i]->step();
      if (done.ok() && !*done) {
        ++i;
        continue;
      }
      finish(*runs_[i], done.status());  // while it still counts among the running
      runs_.erase(runs_.begin() + static_cast<std::ptrdiff_t>(i));
      full = false;
    }
    std::lock_guard<std::mutex> l(mu_);
    running_ = runs_.size();
    if (metrics_) metrics_->running->Set(static_cast<double>(running_));
  }
}

// Defined after Run: runs_ holds them.
Engine::Engine(const model::Model& model, const tok::Tokenizer& tok, Metrics* metrics, EngineOptions options)
    : model_(model),
      tok_(tok),
      metrics_(metrics),
      opt_(std::move(options)),
      think_(tok.find(tok::kTokThink)),
      cache_(opt_.prefix_cache) {
  if (!opt_.mem_available) {
    opt_.mem_available = []() -> StatusOr<uint64_t> {
      ASSIGN_OR_RETURN(const host::MemInfo m, host::read_meminfo());
      return m.available;
    };
  }
  if (metrics_) metrics_->queue_capacity->Set(static_cast<double>(opt_.max_queue));
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  abort_all(absl::UnavailableError("the server is shutting down"));
  cv_.notify_all();
  thread_.join();
}

}  // namespace dsflash::engine
