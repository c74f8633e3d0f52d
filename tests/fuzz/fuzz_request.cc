// Fuzz target: GenerateRequest messages (protobuf bytes) through the service's validation
// and translation (InferenceService::to_params, then the engine's limits) on a tiny
// synthetic model loaded once: every request is accepted or refused with INVALID_ARGUMENT
// (or OUT_OF_RANGE / RESOURCE_EXHAUSTED for limits) naming the field; never a crash.
#include "common/gguf/gguf.h"
#include "inference_svc/api/service.h"
#include "tests/fuzz/fuzz_util.h"
#include "tools/dsflash/synth_model.h"

namespace {

struct World {
  std::unique_ptr<dsflash::gguf::Model> file;
  std::unique_ptr<dsflash::model::Model> model;
  std::unique_ptr<dsflash::tok::Tokenizer> tok;
  std::unique_ptr<dsflash::engine::Engine> engine;
  dsflash::api::Backend backend;
  std::unique_ptr<dsflash::api::InferenceService> service;
};

World& world() {
  static World* w = [] {
    using namespace dsflash;
    auto* x = new World();
    const std::string path = fuzz::temp_path("tiny.gguf");
    if (!tools::write_synthetic_model(tools::SynthOptions{}, path, 1).ok()) __builtin_trap();
    x->file = std::move(*gguf::Model::open(path));
    x->model = std::move(*model::Model::load(*x->file));
    x->tok = std::move(*tok::Tokenizer::from_gguf(*x->file));
    ::unlink(path.c_str());
    x->engine = std::make_unique<engine::Engine>(*x->model, *x->tok, nullptr, engine::EngineOptions{});
    x->backend = api::Backend{x->engine.get(), x->tok.get(), &x->model->config(), nullptr};
    x->service = std::make_unique<api::InferenceService>(nullptr, api::ServiceInfo{"fuzz", "cpu"});
    x->service->attach(&x->backend);
    return x;
  }();
  return *w;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dsflash;
  dsflash::v1::GenerateRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  auto p = world().service->to_params(nullptr, req);
  if (!p.ok()) {
    const auto c = p.status().code();
    DSF_FUZZ_ASSERT(c == absl::StatusCode::kInvalidArgument || c == absl::StatusCode::kOutOfRange ||
                    c == absl::StatusCode::kResourceExhausted);
    DSF_FUZZ_ASSERT(!p.status().message().empty());
  }
  return 0;
}
