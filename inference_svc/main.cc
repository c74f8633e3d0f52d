// dsflash-inference: loads a DeepSeek-V4.1 GGUF on the CPU or CUDA backend and serves
// dsflash.v1.Inference over gRPC (TCP and/or unix:), grpc.health.v1, server reflection, and
// Prometheus metrics. SIGTERM/SIGINT: stop admitting (readiness NOT_SERVING), let in-flight
// requests finish within --grace-seconds, cut the rest with UNAVAILABLE, exit 0.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/gguf/gguf.h"
#include "common/host/host.h"
#include "common/log.h"
#include "inference_svc/api/service.h"
#include "inference_svc/expert_client/expert_client.h"
#include "inference_svc/model/weights.h"
#include "prometheus/exposer.h"

namespace {

std::atomic<int> g_signal{0};
void on_signal(int sig) { g_signal = sig; }

constexpr const char* kUsage =
    "usage: dsflash-inference --model FILE.gguf [options]\n"
    "  --model PATH            the GGUF file, or any shard of a split set\n"
    "  --listen ADDR[,ADDR]    gRPC addresses (default 0.0.0.0:50051; unix:PATH ok)\n"
    "  --metrics HOST:PORT     Prometheus endpoint (default 0.0.0.0:9100)\n"
    "  --max-queue N           admission queue bound (default 16)\n"
    "  --max-running N         requests run at once, taking turns a prefill chunk or a token at a\n"
    "                          time, each on its own sequence (default 4; 1 = one after another)\n"
    "  --max-new-tokens N      default and cap of max_new_tokens (default 256)\n"
    "  --grace-seconds S       drain time on SIGTERM before cutting streams (default 30)\n"
    "  --prefill-chunk N       prompt tokens per model call (default 256)\n"
    "  --load-rate-mbps R      cap the start-up read rate, e.g. to spare a shared NVMe (0 = none)\n"
    "  --expert-store ADDR     routed experts from dsflash-expertstore, e.g.\n"
    "                          unix:/tmp/dsflash-expertstore.sock (default: read in-process)\n"
    "  --backend cpu|cuda      where the forward pass runs (default cpu); cuda copies every weight to\n"
    "                          device memory, routed experts too unless --expert-store names a store\n"
    "                          with a device arena (dsflash-expertstore --arena device), which they are\n"
    "                          then streamed from\n"
    "  --engram-tables auto|device|host  cuda: Engram tables in device memory, or left in the file\n"
    "                          with each step's rows copied over (auto: host when experts are streamed)\n"
    "  --prefetch-next-layer on|off  cuda + --expert-store: hint layer l+1's likely experts from\n"
    "                          layer l (default off; see LoadOptions::prefetch_next_layer)\n"
    "  --expert-activations f32|q8  cuda: decode's Q2_K/Q3_K routed-expert GEMVs read fp32\n"
    "                          activations (default) or 8-bit ones with dp4a (LoadOptions::expert_act_q8)\n"
    "  --sampling device|host  cuda: draw tokens and their logprobs on the device (default) or on\n"
    "                          the host (the logits copied back every token)\n"
    "  --prefix-cache N        sequences kept after their requests (default 2, 0 = off): a prompt that\n"
    "                          continues one (the next turn of a chat) is prefilled only past it;\n"
    "                          running requests count against N (at most N kept or running)\n"
    "  --prefix-copy think|all|none  with --prefix-cache >= 2, which prompts also keep a copy of their\n"
    "                          state before their last token, which costs a decode step: those ending\n"
    "                          with <think> (default; thinking mode's next turn), all (a regenerated\n"
    "                          reply's prompt too) or none\n"
    "  --min-mem-available SIZE  host memory floor, e.g. 4G (default 0 = off): a request about to start\n"
    "                          with less MemAvailable (/proc/meminfo; on GB10 the GPU's memory too)\n"
    "                          frees the kept sequences, then fails RESOURCE_EXHAUSTED\n";

struct Flags {
  std::string model;
  std::string listen = "0.0.0.0:50051";
  std::string metrics = "0.0.0.0:9100";
  size_t max_queue = 16;
  size_t max_running = 4;
  uint32_t max_new_tokens = 256;
  int grace_seconds = 30;
  uint32_t prefill_chunk = 256;
  double load_rate_mbps = 0;  // 0: unlimited
  std::string expert_store;   // address of dsflash-expertstore; empty: experts read in-process
  dsflash::kernels::Backend backend = dsflash::kernels::Backend::kCpu;
  dsflash::model::LoadOptions::EngramTables engram_tables = dsflash::model::LoadOptions::EngramTables::kAuto;
  bool prefetch_next_layer = false;
  bool expert_act_q8 = false;
  bool device_sampling = true;
  size_t prefix_cache = 2;
  dsflash::engine::EngineOptions::PrefixCopy prefix_copy = dsflash::engine::EngineOptions::PrefixCopy::kThink;
  uint64_t min_mem_available = 0;
};

bool parse_flags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    std::string v;
    if (a == "--model" && value(&f->model)) continue;
    if (a == "--listen" && value(&f->listen)) continue;
    if (a == "--metrics" && value(&f->metrics)) continue;
    if (a == "--max-queue" && value(&v) && absl::SimpleAtoi(v, &f->max_queue)) continue;
    if (a == "--max-running" && value(&v) && absl::SimpleAtoi(v, &f->max_running) && f->max_running >= 1 &&
        f->max_running <= 64) {
      continue;
    }
    if (a == "--max-new-tokens" && value(&v) && absl::SimpleAtoi(v, &f->max_new_tokens)) continue;
    if (a == "--grace-seconds" && value(&v) && absl::SimpleAtoi(v, &f->grace_seconds)) continue;
    if (a == "--prefill-chunk" && value(&v) && absl::SimpleAtoi(v, &f->prefill_chunk) && f->prefill_chunk > 0) continue;
    if (a == "--expert-store" && value(&f->expert_store)) continue;
    if (a == "--backend" && value(&v) && (v == "cpu" || v == "cuda")) {
      f->backend = v == "cuda" ? dsflash::kernels::Backend::kCuda : dsflash::kernels::Backend::kCpu;
      continue;
    }
    if (a == "--engram-tables" && value(&v) && (v == "auto" || v == "device" || v == "host")) {
      using E = dsflash::model::LoadOptions::EngramTables;
      f->engram_tables = v == "auto" ? E::kAuto : (v == "device" ? E::kDevice : E::kHost);
      continue;
    }
    if (a == "--prefetch-next-layer" && value(&v) && (v == "on" || v == "off")) {
      f->prefetch_next_layer = v == "on";
      continue;
    }
    if (a == "--expert-activations" && value(&v) && (v == "f32" || v == "q8")) {
      f->expert_act_q8 = v == "q8";
      continue;
    }
    if (a == "--sampling" && value(&v) && (v == "device" || v == "host")) {
      f->device_sampling = v == "device";
      continue;
    }
    if (a == "--prefix-cache" && value(&v) && absl::SimpleAtoi(v, &f->prefix_cache) && f->prefix_cache <= 64) continue;
    if (a == "--prefix-copy" && value(&v) && (v == "think" || v == "all" || v == "none")) {
      using C = dsflash::engine::EngineOptions::PrefixCopy;
      f->prefix_copy = v == "think" ? C::kThink : (v == "all" ? C::kAll : C::kNone);
      continue;
    }
    if (a == "--min-mem-available" && value(&v) && (v == "0" || dsflash::host::parse_size(v, &f->min_mem_available))) continue;
    if (a == "--load-rate-mbps" && value(&v) && absl::SimpleAtod(v, &f->load_rate_mbps) && f->load_rate_mbps >= 0) continue;
    std::fprintf(stderr, "dsflash-inference: bad argument '%s'\n", a.c_str());
    return false;
  }
  if (f->min_mem_available > 0) {
    if (auto m = dsflash::host::read_meminfo(); !m.ok()) {
      std::fprintf(stderr, "dsflash-inference: --min-mem-available needs the host's memory figures: %s\n",
                   std::string(m.status().message()).c_str());
      return false;
    }
  }
  if (f->expert_act_q8 && f->backend != dsflash::kernels::Backend::kCuda) {
    std::fprintf(stderr, "dsflash-inference: --expert-activations q8 needs --backend cuda\n");
    return false;
  }
  return !f->model.empty();
}

dsflash::model::LoadOptions load_options(const Flags& flags) {
  dsflash::model::LoadOptions o{flags.backend};
  o.engram_tables = flags.engram_tables;
  o.prefetch_next_layer = flags.prefetch_next_layer;
  o.expert_act_q8 = flags.expert_act_q8;
  return o;
}

dsflash::engine::EngineOptions engine_options(const Flags& flags) {
  dsflash::engine::EngineOptions o;
  o.max_queue = flags.max_queue;
  o.max_running = flags.max_running;
  o.default_max_new_tokens = flags.max_new_tokens;
  o.prefill_chunk = flags.prefill_chunk;
  o.device_sampling = flags.device_sampling;
  o.prefix_cache = flags.prefix_cache;
  o.prefix_copy = flags.prefix_copy;
  o.min_mem_available = flags.min_mem_available;
  return o;
}

std::unique_ptr<grpc::Server> start_server(const Flags& flags, dsflash::api::InferenceService& service) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  for (absl::string_view addr : absl::StrSplit(flags.listen, ',', absl::SkipEmpty())) {
    builder.AddListeningPort(std::string(addr), grpc::InsecureServerCredentials());
  }
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(16 << 20);
  builder.SetMaxSendMessageSize(16 << 20);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  return builder.BuildAndStart();
}

struct Loaded {
  std::unique_ptr<dsflash::model::Model> model;
  std::unique_ptr<dsflash::tok::Tokenizer> tok;
};

// Reads the resident weights with progress (log every 2 s and a gauge), then builds the model
// and the tokenizer. A signal while loading cancels.
dsflash::StatusOr<std::unique_ptr<Loaded>> load(const dsflash::gguf::Model& file, dsflash::engine::Metrics& metrics,
                                                 double rate_mbps,
                                                 std::unique_ptr<dsflash::model::ExpertSource> experts,
                                                  dsflash::model::LoadOptions options) {
  using namespace dsflash;
  const auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  RETURN_IF_ERROR(model::warm_resident(file, [&](uint64_t done, uint64_t total) {
    metrics.load_progress->Set(total ? static_cast<double>(done) / static_cast<double>(total) : 1.0);
    if (rate_mbps > 0) {  // hold the average read rate at the cap
      const auto due = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(done / (rate_mbps * 1e6)));
      while (std::chrono::steady_clock::now() < due && g_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const auto now = std::chrono::steady_clock::now();
    if (now - last >= std::chrono::seconds(2) || done == total) {
      last = now;
      const double s = std::chrono::duration<double>(now - t0).count(), rate = done / std::max(s, 1e-9);
      log::info("loading resident weights: %.2f / %.2f GiB, %.0f MB/s, ETA %.0f s", done / 1073741824.0,
                total / 1073741824.0, rate / 1e6, (total - done) / std::max(rate, 1.0));
    }
    return g_signal == 0;
  }));
  auto out = std::make_unique<Loaded>();
  ASSIGN_OR_RETURN(out->model, model::Model::load(file, std::move(experts), options));
  ASSIGN_OR_RETURN(out->tok, tok::Tokenizer::from_gguf(file));
  const auto& c = out->model->config();
  log::info("model '%s' loaded in %.2f s: %u layers, vocab %u, context %u, %s backend", c.name,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), c.n_layer, c.n_vocab, c.n_ctx,
            options.backend == kernels::Backend::kCuda ? "CUDA" : "CPU");
  return out;
}

// With --expert-store the routed experts come from the store process; the session is kept
// (and re-established) in the background and readiness follows it.
dsflash::StatusOr<std::unique_ptr<dsflash::expertclient::ExpertClient>> connect_store(const Flags& flags,
                                                                                      const dsflash::gguf::Model& file,
                                                                                      dsflash::engine::Metrics& metrics) {
  using namespace dsflash;
  ASSIGN_OR_RETURN(const config::ModelConfig cfg, config::from_gguf(file));
  ASSIGN_OR_RETURN(const std::string fp, file.fingerprint("_exps."));
  auto c = std::make_unique<expertclient::ExpertClient>(
      expertclient::ClientOptions{.address = flags.expert_store,
                                  .model_fingerprint = fp,
                                  .device_arena = flags.backend == kernels::Backend::kCuda},
      cfg);
  c->set_observer([&metrics](bool hit, double s) { metrics.expert_fetch(hit)->Observe(s); });
  return c;
}

// Serves until SIGTERM/SIGINT with readiness = loaded and (with a store) its session up;
// then drains: readiness off, no admissions, in-flight requests get --grace-seconds to
// finish, the rest are cut with UNAVAILABLE.
void serve_until_signal(const Flags& flags, dsflash::engine::Engine& eng, dsflash::expertclient::ExpertClient* client,
                        grpc::HealthCheckServiceInterface& health, dsflash::engine::Metrics& metrics) {
  bool ready = false;
  for (int tick = 0; g_signal == 0; ++tick) {
    if (tick % 20 == 0) {  // host memory gauges, once a second
      if (auto m = dsflash::host::read_meminfo(); m.ok()) {
        metrics.host_mem_total->Set(static_cast<double>(m->total));
        metrics.host_mem_available->Set(static_cast<double>(m->available));
      }
    }
    const bool up = client == nullptr || client->connected();
    metrics.store_up->Set(up ? 1 : 0);
    if (up != ready) {
      ready = up;
      health.SetServingStatus("dsflash.v1.Inference", ready);
      dsflash::log::info("readiness: %s", ready ? "SERVING" : "NOT_SERVING (expert store down)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  dsflash::log::info("signal %d: draining (grace %d s, %zu request(s) in flight)", g_signal.load(), flags.grace_seconds,
                     eng.in_flight());
  eng.drain();
  health.SetServingStatus("dsflash.v1.Inference", false);
  metrics.model_loaded->Set(0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(flags.grace_seconds);
  while (eng.in_flight() > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (eng.in_flight() > 0) eng.abort_all(absl::UnavailableError("the server is shutting down"));
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dsflash;
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  if (!parse_flags(argc, argv, &flags)) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  std::signal(SIGPIPE, SIG_IGN);

  auto file = gguf::Model::open(flags.model);
  if (!file.ok()) {
    log::error("%s", std::string(file.status().message()));
    return 1;
  }
  const gguf::Value* name_v = (*file)->find("general.name");
  const std::string name = name_v && name_v->as_string() ? *name_v->as_string() : flags.model;

  // Metrics and the gRPC server come up first: liveness SERVING, readiness NOT_SERVING and
  // every RPC UNAVAILABLE until the model is loaded.
  const std::string backend_name = flags.backend == kernels::Backend::kCuda ? "cuda" : "cpu";
  engine::Metrics metrics(name, backend_name);
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(flags.metrics);
  } catch (const std::exception& e) {
    log::error("cannot serve metrics on %s: %s", flags.metrics, e.what());
    return 1;
  }
  exposer->RegisterCollectable(metrics.registry());
  api::InferenceService service(&metrics, api::ServiceInfo{name, backend_name});
  std::unique_ptr<grpc::Server> server = start_server(flags, service);
  if (!server) {
    log::error("cannot listen on %s", flags.listen);
    return 1;
  }
  auto* health = server->GetHealthCheckService();
  health->SetServingStatus("", true);
  health->SetServingStatus("dsflash.v1.Inference", false);
  log::info("listening on %s (not ready: loading %s, %.1f MiB in %zu file(s)); metrics on %s/metrics", flags.listen,
            flags.model, (*file)->total_bytes() / 1048576.0, (*file)->n_shards(), flags.metrics);

  std::unique_ptr<model::ExpertSource> experts;
  expertclient::ExpertClient* client = nullptr;
  if (!flags.expert_store.empty()) {
    auto c = connect_store(flags, **file, metrics);
    if (!c.ok()) {
      log::error("%s", std::string(c.status().message()));
      return 1;
    }
    client = c->get();
    experts = std::move(*c);
  }
  auto loaded = load(**file, metrics, flags.load_rate_mbps, std::move(experts), load_options(flags));
  if (!loaded.ok()) {
    log::error("%s", std::string(loaded.status().message()));
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    return absl::IsCancelled(loaded.status()) ? 0 : 1;
  }
  Loaded& l = **loaded;
  engine::Engine eng(*l.model, *l.tok, &metrics, engine_options(flags));
  api::Backend backend{&eng, l.tok.get(), &l.model->config(), nullptr};
  if (client) backend.available = [client] { return client->availability(); };
  service.attach(&backend);
  metrics.model_loaded->Set(1);
  log::info("loaded: serving dsflash.v1.Inference%s", client ? " (ready once the expert store session is up)" : "");

  serve_until_signal(flags, eng, client, *health, metrics);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  log::info("stopped");
  return 0;
}
