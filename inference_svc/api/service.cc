// The Inference RPCs. Generate: the reactor owns a Channel shared with the engine; the engine
// pushes events from its thread, the channel starts a write when none is in flight, and
// OnWriteDone pulls the next one. A reaction never blocks; the channel outlives the reactor
// if the engine still holds it.
#include <deque>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "inference_svc/api/service.h"

namespace dsflash::api {
namespace {

using dsflash::v1::GenerateEvent;

std::string code_name(const grpc::Status& s) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code()));
}
std::string code_name(const Status& s) { return absl::StatusCodeToString(s.code()); }

void fill_tokens(const engine::TokensEvent& e, dsflash::v1::Tokens* t) {
  for (int32_t id : e.ids) t->add_token_ids(static_cast<uint32_t>(id));
  t->set_text_delta(e.text);
  for (const auto& lp : e.logprobs) {
    auto* p = t->add_logprobs();
    p->set_token_id(static_cast<uint32_t>(lp.token));
    p->set_logprob(lp.logprob);
    for (size_t i = 0; i < lp.top_ids.size(); ++i) {
      p->add_top_ids(static_cast<uint32_t>(lp.top_ids[i]));
      p->add_top_logprobs(lp.top_logprobs[i]);
    }
  }
}

void fill_final(const engine::FinalEvent& f, dsflash::v1::Final* out) {
  using FR = dsflash::v1::FinishReason;
  FR r = FR::LENGTH;
  switch (f.reason) {
    case engine::FinishReason::kLength: r = FR::LENGTH; break;
    case engine::FinishReason::kEos: r = FR::EOS; break;
    case engine::FinishReason::kStopSequence: r = FR::STOP_SEQUENCE; break;
    case engine::FinishReason::kStopToken: r = FR::STOP_TOKEN; break;
  }
  out->set_finish_reason(r);
  out->set_matched_stop(f.matched_stop);
  out->mutable_usage()->set_prompt_tokens(f.prompt_tokens);
  out->mutable_usage()->set_completion_tokens(f.completion_tokens);
  out->mutable_usage()->set_cached_tokens(f.cached_tokens);
  out->mutable_timings()->set_queue_seconds(f.queue_s);
  out->mutable_timings()->set_time_to_first_token_seconds(f.ttft_s);
  out->mutable_timings()->set_e2e_seconds(f.e2e_s);
  out->set_seed(f.seed);
}

class GenerateReactor;

// Engine-side handle of one Generate call; thread-safe.
class Channel final : public engine::Stream {
 public:
  Channel(GenerateReactor* r, std::string id) : reactor_(r), request_id_(std::move(id)) {}
  void on_tokens(engine::TokensEvent e) override;
  void on_final(engine::FinalEvent e) override;
  void on_error(Status s) override;
  bool cancelled() const override { return cancelled_; }

  void cancel() { cancelled_ = true; }
  // Called by the reactor: the next event to write, or the terminal status when the queue is
  // empty and the request has ended. Returns false when there is nothing to do yet.
  bool next(GenerateEvent* ev, std::optional<grpc::Status>* done);
  void detach();  // the reactor is gone

 private:
  void push(GenerateEvent ev, std::optional<grpc::Status> end);
  std::mutex mu_;
  GenerateReactor* reactor_;
  std::string request_id_;
  std::deque<GenerateEvent> events_;
  std::optional<grpc::Status> end_;
  bool writing_ = false;
  std::atomic<bool> cancelled_{false};
  friend class GenerateReactor;
};

class GenerateReactor final : public grpc::ServerWriteReactor<GenerateEvent> {
 public:
  GenerateReactor(InferenceService& svc, grpc::CallbackServerContext* ctx, const dsflash::v1::GenerateRequest& req)
      : svc_(svc) {
    auto params = svc.to_params(ctx, req);
    if (!params.ok()) {
      finish(to_grpc(params.status()));
      return;
    }
    channel_ = std::make_shared<Channel>(this, params->request_id);
    const Status s = svc.backend()->engine->submit(std::move(*params), channel_);
    if (!s.ok()) {
      channel_->detach();
      channel_.reset();
      if (absl::IsResourceExhausted(s)) ctx->AddTrailingMetadata("grpc-retry-pushback-ms", "1000");
      finish(to_grpc(s));
    }
  }
  // Writes the next queued event, or finishes; called with no write in flight.
  void pump() {
    GenerateEvent ev;
    std::optional<grpc::Status> done;
    if (channel_->next(&ev, &done)) {
      current_ = std::move(ev);
      StartWrite(&current_);
    } else if (done) {
      finish(*done);
    }
  }
  // A failed write means the client is gone: the engine is told to stop, queued events are
  // dropped, and the call finishes as soon as the engine reports the end.
  void OnWriteDone(bool ok) override {
    if (!ok) channel_->cancel();
    pump();
  }
  void OnCancel() override {
    if (channel_) channel_->cancel();
  }
  void OnDone() override {
    if (channel_) channel_->detach();
    delete this;
  }

 private:
  void finish(const grpc::Status& s) {
    if (svc_.metrics()) svc_.metrics()->request_done("Generate", code_name(s));
    Finish(s);
  }
  InferenceService& svc_;
  std::shared_ptr<Channel> channel_;
  GenerateEvent current_;
};

void Channel::push(GenerateEvent ev, std::optional<grpc::Status> end) {
  GenerateReactor* r = nullptr;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (end) end_ = end;
    else events_.push_back(std::move(ev));
    if (reactor_ == nullptr || writing_) return;
    writing_ = true;
    r = reactor_;
  }
  r->pump();
}

bool Channel::next(GenerateEvent* ev, std::optional<grpc::Status>* done) {
  std::lock_guard<std::mutex> l(mu_);
  if (cancelled_) events_.clear();
  if (!events_.empty()) {
    *ev = std::move(events_.front());
    events_.pop_front();
    return true;
  }
  writing_ = false;
  if (end_ && reactor_ != nullptr) {
    *done = end_;
    writing_ = true;  // nothing more will be written
  }
  return false;
}

void Channel::detach() {
  std::lock_guard<std::mutex> l(mu_);
  reactor_ = nullptr;
  cancelled_ = true;
}

void Channel::on_tokens(engine::TokensEvent e) {
  GenerateEvent ev;
  ev.set_request_id(request_id_);
  fill_tokens(e, ev.mutable_tokens());
  push(std::move(ev), std::nullopt);
}

void Channel::on_final(engine::FinalEvent f) {
  GenerateEvent ev;
  ev.set_request_id(request_id_);
  fill_final(f, ev.mutable_final());
  push(std::move(ev), std::nullopt);
  push(GenerateEvent(), grpc::Status::OK);
}

void Channel::on_error(Status s) { push(GenerateEvent(), to_grpc(s)); }

// GenerateUnary: the same engine path, events collected into one result.
class UnaryCollector final : public engine::Stream {
 public:
  UnaryCollector(grpc::ServerUnaryReactor* r, dsflash::v1::GenerateResult* res, grpc::CallbackServerContext* ctx,
                 engine::Metrics* m)
      : reactor_(r), res_(res), ctx_(ctx), metrics_(m) {}
  void on_tokens(engine::TokensEvent e) override {
    for (int32_t id : e.ids) res_->add_token_ids(static_cast<uint32_t>(id));
    res_->mutable_text()->append(e.text);
    dsflash::v1::Tokens t;
    fill_tokens(e, &t);
    for (auto& lp : *t.mutable_logprobs()) *res_->add_logprobs() = lp;
  }
  void on_final(engine::FinalEvent f) override {
    fill_final(f, res_->mutable_final());
    done(grpc::Status::OK);
  }
  void on_error(Status s) override { done(to_grpc(s)); }
  bool cancelled() const override { return ctx_->IsCancelled(); }

 private:
  void done(const grpc::Status& s) {
    if (metrics_) metrics_->request_done("GenerateUnary", code_name(s));
    reactor_->Finish(s);
  }
  grpc::ServerUnaryReactor* reactor_;
  dsflash::v1::GenerateResult* res_;
  grpc::CallbackServerContext* ctx_;
  engine::Metrics* metrics_;
};

}  // namespace

grpc::ServerWriteReactor<GenerateEvent>* InferenceService::Generate(grpc::CallbackServerContext* ctx,
                                                                    const dsflash::v1::GenerateRequest* req) {
  return new GenerateReactor(*this, ctx, *req);
}

grpc::ServerUnaryReactor* InferenceService::GenerateUnary(grpc::CallbackServerContext* ctx,
                                                          const dsflash::v1::GenerateRequest* req,
                                                          dsflash::v1::GenerateResult* res) {
  auto* reactor = ctx->DefaultReactor();
  auto params = to_params(ctx, *req);
  if (!params.ok()) {
    if (metrics_) metrics_->request_done("GenerateUnary", code_name(params.status()));
    reactor->Finish(to_grpc(params.status()));
    return reactor;
  }
  res->set_request_id(params->request_id);
  auto collector = std::make_shared<UnaryCollector>(reactor, res, ctx, metrics_);
  const Status s = backend()->engine->submit(std::move(*params), collector);
  if (!s.ok()) {
    if (absl::IsResourceExhausted(s)) ctx->AddTrailingMetadata("grpc-retry-pushback-ms", "1000");
    if (metrics_) metrics_->request_done("GenerateUnary", code_name(s));
    reactor->Finish(to_grpc(s));
  }
  return reactor;
}

const Backend* InferenceService::ready_or_finish(grpc::ServerUnaryReactor* reactor, const char* rpc) {
  const Backend* b = backend();
  if (b == nullptr) {
    const Status s = absl::UnavailableError(kModelLoading);
    if (metrics_) metrics_->request_done(rpc, code_name(s));
    reactor->Finish(to_grpc(s));
  }
  return b;
}

grpc::ServerUnaryReactor* InferenceService::Tokenize(grpc::CallbackServerContext* ctx,
                                                     const dsflash::v1::TokenizeRequest* req,
                                                     dsflash::v1::TokenizeResponse* res) {
  auto* reactor = ctx->DefaultReactor();
  const Backend* b = ready_or_finish(reactor, "Tokenize");
  if (b == nullptr) return reactor;
  const tok::Tokenizer& tok = *b->tok;
  StatusOr<std::vector<int32_t>> ids = absl::InvalidArgumentError("input: text or chat is required");
  if (req->has_chat()) {
    std::vector<tok::ChatMessage> msgs;
    for (const auto& m : req->chat().messages()) msgs.push_back({m.role(), m.content(), m.reasoning()});
    tok::ChatOptions o;
    o.thinking = req->chat().thinking();
    o.reasoning_effort = req->chat().reasoning_effort();
    ids = tok::encode_chat(tok, msgs, o);
    if (!ids.ok()) ids = absl::InvalidArgumentError(absl::StrCat("chat: ", ids.status().message()));
  } else if (req->input_case() == dsflash::v1::TokenizeRequest::kText) {
    ids = tok.encode(req->text(), req->parse_special());
  }
  if (ids.ok()) {
    for (int32_t id : *ids) {
      res->add_token_ids(static_cast<uint32_t>(id));
      res->add_pieces(tok.token_bytes(id).value_or(""));
    }
  }
  if (metrics_) metrics_->request_done("Tokenize", code_name(ids.status()));
  reactor->Finish(ids.ok() ? grpc::Status::OK : to_grpc(ids.status()));
  return reactor;
}

grpc::ServerUnaryReactor* InferenceService::GetModelInfo(grpc::CallbackServerContext* ctx,
                                                         const dsflash::v1::GetModelInfoRequest*,
                                                         dsflash::v1::ModelInfo* res) {
  auto* reactor = ctx->DefaultReactor();
  const Backend* b = ready_or_finish(reactor, "GetModelInfo");
  if (b == nullptr) return reactor;
  const config::ModelConfig& cfg = *b->cfg;
  const tok::Tokenizer& tok = *b->tok;
  res->set_model_name(info_.model_name);
  res->set_architecture("deepseek41");
  res->set_vocab_size(cfg.n_vocab);
  res->set_context_length(cfg.n_ctx);
  res->set_max_prompt_tokens(cfg.n_ctx - 1);
  res->set_max_new_tokens(b->engine->options().default_max_new_tokens);
  res->set_bos_token_id(static_cast<uint32_t>(std::max(0, tok.bos())));
  res->set_eos_token_id(static_cast<uint32_t>(std::max(0, tok.eos())));
  res->set_backend(info_.backend);
  if (metrics_) metrics_->request_done("GetModelInfo", "OK");
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace dsflash::api
