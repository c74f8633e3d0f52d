// dsflash.v1.Inference over gRPC's callback API: request validation and translation at the
// edge, Generate as a write reactor fed by the engine (one write in flight, never blocking in
// a reaction), GenerateUnary, Tokenize and GetModelInfo. Status -> grpc::Status mapping
// happens here only.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "dsflash/v1/inference.grpc.pb.h"
#include "inference_svc/engine/engine.h"

namespace dsflash::api {

struct ServiceInfo {
  std::string model_name;
  std::string backend = "cpu";
};

// What the RPCs need once the model is loaded.
struct Backend {
  engine::Engine* engine = nullptr;
  const tok::Tokenizer* tok = nullptr;
  const config::ModelConfig* cfg = nullptr;
  // When set, generation requests are refused with its error while it returns one (e.g. the
  // expert store is down).
  std::function<Status()> available;
};

// Serves from start-up on: until attach() every RPC answers UNAVAILABLE ("model loading").
class InferenceService final : public dsflash::v1::Inference::CallbackService {
 public:
  InferenceService(engine::Metrics* metrics, ServiceInfo info) : metrics_(metrics), info_(std::move(info)) {}

  // Makes the service ready; `b` must outlive the service.
  void attach(const Backend* b) { backend_.store(b); }
  const Backend* backend() const { return backend_.load(); }

  grpc::ServerWriteReactor<dsflash::v1::GenerateEvent>* Generate(grpc::CallbackServerContext* ctx,
                                                                 const dsflash::v1::GenerateRequest* req) override;
  grpc::ServerUnaryReactor* GenerateUnary(grpc::CallbackServerContext* ctx, const dsflash::v1::GenerateRequest* req,
                                          dsflash::v1::GenerateResult* res) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx, const dsflash::v1::TokenizeRequest* req,
                                     dsflash::v1::TokenizeResponse* res) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx, const dsflash::v1::GetModelInfoRequest* req,
                                         dsflash::v1::ModelInfo* res) override;

  // Turns a request into engine parameters (tokenising text or chat). Exposed for tests.
  StatusOr<engine::GenerateParams> to_params(const grpc::CallbackServerContext* ctx,
                                             const dsflash::v1::GenerateRequest& req) const;

  engine::Metrics* metrics() { return metrics_; }

 private:
  // The backend, or nullptr after finishing `reactor` with UNAVAILABLE (counted for `rpc`).
  const Backend* ready_or_finish(grpc::ServerUnaryReactor* reactor, const char* rpc);

  std::atomic<const Backend*> backend_{nullptr};
  engine::Metrics* metrics_;
  ServiceInfo info_;
};

inline constexpr const char* kModelLoading = "the model is still loading";

// absl::Status -> grpc::Status with the same code and message.
grpc::Status to_grpc(const Status& s);

}  // namespace dsflash::api
