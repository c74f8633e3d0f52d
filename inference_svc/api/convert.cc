// Request translation at the RPC edge: proto -> engine parameters, engine events -> proto.
#include <atomic>

#include "absl/strings/str_cat.h"
#include "inference_svc/api/service.h"

namespace dsflash::api {

grpc::Status to_grpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

StatusOr<engine::GenerateParams> InferenceService::to_params(const grpc::CallbackServerContext* ctx,
                                                             const dsflash::v1::GenerateRequest& req) const {
  const Backend* b = backend();
  if (b == nullptr) return absl::UnavailableError(kModelLoading);
  if (b->available) RETURN_IF_ERROR(b->available());
  const tok::Tokenizer& tok = *b->tok;
  engine::GenerateParams p;
  static std::atomic<uint64_t> next_id{1};
  p.request_id = req.request_id().empty() ? absl::StrCat("req-", next_id++) : req.request_id();
  switch (req.input_case()) {
    case dsflash::v1::GenerateRequest::kPrompt: {
      ASSIGN_OR_RETURN(p.prompt, tok.encode(req.prompt(), false));
      if (tok.add_bos() && tok.bos() >= 0) p.prompt.insert(p.prompt.begin(), tok.bos());
      break;
    }
    case dsflash::v1::GenerateRequest::kPromptTokenIds:
      p.prompt.assign(req.prompt_token_ids().ids().begin(), req.prompt_token_ids().ids().end());
      for (uint32_t id : req.prompt_token_ids().ids()) {
        if (id > static_cast<uint32_t>(INT32_MAX)) return absl::InvalidArgumentError("prompt_token_ids: id out of range");
      }
      break;
    case dsflash::v1::GenerateRequest::kChat: {
      std::vector<tok::ChatMessage> msgs;
      for (const auto& m : req.chat().messages()) msgs.push_back({m.role(), m.content(), m.reasoning()});
      tok::ChatOptions o;
      o.thinking = req.chat().thinking();
      o.reasoning_effort = req.chat().reasoning_effort();
      auto ids = tok::encode_chat(tok, msgs, o);
      if (!ids.ok()) return absl::InvalidArgumentError(absl::StrCat("chat: ", ids.status().message()));
      p.prompt = std::move(*ids);
      break;
    }
    default:
      return absl::InvalidArgumentError("input: exactly one of prompt, prompt_token_ids or chat is required");
  }
  const auto& s = req.sampling();
  if (s.has_temperature()) p.sampling.temperature = s.temperature();
  if (s.has_top_p()) p.sampling.top_p = s.top_p();
  if (s.has_top_k()) p.sampling.top_k = s.top_k();
  if (s.has_min_p()) p.sampling.min_p = s.min_p();
  if (s.has_repetition_penalty()) p.sampling.repetition_penalty = s.repetition_penalty();
  if (s.has_presence_penalty()) p.sampling.presence_penalty = s.presence_penalty();
  if (s.has_frequency_penalty()) p.sampling.frequency_penalty = s.frequency_penalty();
  if (s.has_seed()) {
    p.sampling.seed = s.seed();
    p.seed_given = true;
  }
  const auto& st = req.stopping();
  if (st.has_max_new_tokens()) {
    if (st.max_new_tokens() == 0) return absl::InvalidArgumentError("stopping.max_new_tokens: must be >= 1");
    p.stop.max_new_tokens = st.max_new_tokens();
  }
  p.stop.min_new_tokens = st.min_new_tokens();
  p.stop.stop.assign(st.stop().begin(), st.stop().end());
  for (uint32_t id : st.stop_token_ids()) p.stop.stop_token_ids.push_back(static_cast<int32_t>(std::min<uint32_t>(id, INT32_MAX)));
  p.stop.ignore_eos = st.ignore_eos();
  p.stop.include_stop_in_output = st.include_stop_in_output();
  p.output.logprobs = req.output().return_logprobs();
  p.output.top_logprobs = req.output().top_logprobs();
  p.output.skip_special_tokens = !req.output().has_skip_special_tokens() || req.output().skip_special_tokens();
  if (ctx != nullptr && ctx->deadline() != std::chrono::system_clock::time_point::max()) {
    const auto left = ctx->deadline() - std::chrono::system_clock::now();
    if (left <= std::chrono::milliseconds(0)) return absl::DeadlineExceededError("the request deadline already passed");
    p.deadline = engine::Clock::now() + std::chrono::duration_cast<engine::Clock::duration>(left);
  }
  RETURN_IF_ERROR(b->engine->validate(p));
  return p;
}

}  // namespace dsflash::api
