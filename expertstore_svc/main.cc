// dsflash-expertstore: owns the expert bytes of a DeepSeek-V4.1 GGUF set and shares them
// with inference processes: an arena of expert slots sized by --budget, a slot table and a
// lease table in shared memory, reader threads behind a page-locked staging ring, and
// dsflash.v1.ExpertStore over gRPC (unix: and/or TCP) with grpc.health.v1 and Prometheus
// metrics. SIGTERM/SIGINT: readiness NOT_SERVING, sessions ended with UNAVAILABLE, exit 0.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/host/host.h"
#include "common/log.h"
#include "expertstore_svc/service.h"
#include "prometheus/exposer.h"

namespace {

std::atomic<int> g_signal{0};
void on_signal(int sig) { g_signal = sig; }

constexpr const char* kUsage =
    "usage: dsflash-expertstore --model FILE.gguf [options]\n"
    "  --model PATH          the GGUF file, or any shard of a split set\n"
    "  --listen ADDR[,ADDR]  gRPC addresses (default unix:/tmp/dsflash-expertstore.sock; HOST:PORT for TCP)\n"
    "  --fd-socket PATH      Unix socket handing sessions their shared-memory fds\n"
    "                        (default: the first unix: address + \".fds\")\n"
    "  --metrics HOST:PORT   Prometheus endpoint (default 0.0.0.0:9101; 'off' disables)\n"
    "  --budget SIZE         expert arena bytes, e.g. 512M, 64G (default 1G)\n"
    "  --host-cache SIZE     a host-memory tier between disk and arena, e.g. 96G (default 0: none)\n"
    "  --reader-threads N    shard reader threads (default 8)\n"
    "  --staging-buffers N   staging ring buffers (default 2 per reader)\n"
    "  --pin-staging BOOL    page-lock the staging ring; failure is an error (default true)\n"
    "  --direct-io BOOL      O_DIRECT shard reads where supported (default true)\n"
    "  --arena KIND          host (memfd; what the CPU backend reads), device (CUDA memory) or auto\n"
    "                        (device when a GPU is present) (default host)\n"
    "  --device N            CUDA device of a device arena (default 0)\n"
    "  --device-sharing M    auto (VMM POSIX-fd, else legacy IPC), cuda-vmm-fd or cuda-ipc (default auto)\n"
    "  --expert-tiles BOOL   a device arena keeps Q2_K / Q3_K experts in the GPU GEMVs' tile order\n"
    "                        (default true; false: the GGUF order, for clients that read only that)\n"
    "  --eviction P          lfu (default: the least often used expert, counts aged), lru, or\n"
    "                        random-oldest:F (a random victim among the oldest fraction F of the\n"
    "                        unleased slots, 0 < F <= 1)\n";

struct Flags {
  std::string model, listen = "unix:/tmp/dsflash-expertstore.sock", fd_socket, metrics = "0.0.0.0:9101";
  dsflash::expertstore::StoreOptions store;
};

bool parse_bool(const std::string& v, bool* out) {
  if (v == "true" || v == "1") return *out = true, true;
  if (v == "false" || v == "0") return *out = false, true;
  return false;
}

// "lfu" -> least frequent; "lru" -> 0; "random-oldest:F" -> F in (0, 1].
bool parse_eviction(const std::string& v, bool* least_frequent, double* fraction) {
  *least_frequent = v == "lfu";
  *fraction = 0;
  if (v == "lfu" || v == "lru") return true;
  const std::string prefix = "random-oldest:";
  return v.rfind(prefix, 0) == 0 && absl::SimpleAtod(v.substr(prefix.size()), fraction) && *fraction > 0 &&
         *fraction <= 1;
}

// 0: parsed; 1: --help; 2: bad arguments (message printed).
int parse_flags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") return 1;
    std::string v;
    const bool has = i + 1 < argc;
    if (has) v = argv[i + 1];
    bool ok = has;
    if (a == "--model") f->model = v;
    else if (a == "--listen") f->listen = v;
    else if (a == "--fd-socket") f->fd_socket = v;
    else if (a == "--metrics") f->metrics = v;
    else if (a == "--budget") ok = ok && dsflash::host::parse_size(v, &f->store.budget_bytes);
    else if (a == "--host-cache") ok = ok && dsflash::host::parse_size(v, &f->store.host_cache_bytes);
    else if (a == "--reader-threads") ok = ok && absl::SimpleAtoi(v, &f->store.reader_threads) && f->store.reader_threads > 0;
    else if (a == "--staging-buffers") ok = ok && absl::SimpleAtoi(v, &f->store.staging_buffers) && f->store.staging_buffers >= 0;
    else if (a == "--pin-staging") ok = ok && parse_bool(v, &f->store.pin_staging);
    else if (a == "--direct-io") ok = ok && parse_bool(v, &f->store.direct_io);
    else if (a == "--expert-tiles") ok = ok && parse_bool(v, &f->store.tiles);
    else if (a == "--arena") ok = ok && (v == "host" || v == "device" || v == "auto") && (f->store.arena = v, true);
    else if (a == "--device") ok = ok && absl::SimpleAtoi(v, &f->store.device) && f->store.device >= 0;
    else if (a == "--eviction") ok = ok && parse_eviction(v, &f->store.evict_least_frequent, &f->store.evict_oldest_fraction);
    else if (a == "--device-sharing")
      ok = ok && (v == "auto" || v == "cuda-vmm-fd" || v == "cuda-ipc") && (f->store.device_mechanism = v, true);
    else ok = false;
    if (!ok) {
      std::fprintf(stderr, "dsflash-expertstore: bad argument '%s'%s\n%s", a.c_str(), has ? "" : " (missing value)", kUsage);
      return 2;
    }
    ++i;
  }
  if (f->model.empty()) {
    std::fprintf(stderr, "dsflash-expertstore: --model is required\n%s", kUsage);
    return 2;
  }
  if (f->fd_socket.empty()) {
    for (absl::string_view addr : absl::StrSplit(f->listen, ',', absl::SkipEmpty())) {
      if (absl::StartsWith(addr, "unix:")) {
        f->fd_socket = std::string(addr.substr(5)) + ".fds";
        break;
      }
    }
    if (f->fd_socket.empty()) {
      std::fprintf(stderr, "dsflash-expertstore: no unix: address in --listen; pass --fd-socket PATH\n");
      return 2;
    }
  }
  return 0;
}

// Brings the shared-memory counters up to date on every scrape.
class RefreshingCollectable : public prometheus::Collectable {
 public:
  explicit RefreshingCollectable(dsflash::expertstore::StoreMetrics& m) : m_(m) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    m_.refresh();
    return m_.registry()->Collect();
  }

 private:
  dsflash::expertstore::StoreMetrics& m_;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace dsflash;
  Flags flags;
  if (const int rc = parse_flags(argc, argv, &flags); rc != 0) {
    if (rc == 1) std::fputs(kUsage, stdout);
    return rc == 1 ? 0 : 2;
  }
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  std::signal(SIGPIPE, SIG_IGN);

  auto store = expertstore::Store::open(flags.model, flags.store);
  if (!store.ok()) {
    log::error("%s", std::string(store.status().message()));
    return 1;
  }
  expertstore::StoreMetrics metrics(**store);
  (*store)->set_load_observer([&metrics](const expertstore::LoadEvent& ev) { metrics.on_load(ev); });
  std::unique_ptr<prometheus::Exposer> exposer;
  auto collectable = std::make_shared<RefreshingCollectable>(metrics);
  if (flags.metrics != "off") {
    try {
      exposer = std::make_unique<prometheus::Exposer>(flags.metrics);
    } catch (const std::exception& e) {
      log::error("cannot serve metrics on %s: %s", flags.metrics, e.what());
      return 1;
    }
    exposer->RegisterCollectable(collectable);
  }
  auto service = expertstore::ExpertStoreService::create(**store, &metrics, flags.fd_socket);
  if (!service.ok()) {
    log::error("%s", std::string(service.status().message()));
    return 1;
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  for (absl::string_view addr : absl::StrSplit(flags.listen, ',', absl::SkipEmpty())) {
    if (absl::StartsWith(addr, "unix:")) ::unlink(std::string(addr.substr(5)).c_str());  // a stale socket file
    builder.AddListeningPort(std::string(addr), grpc::InsecureServerCredentials());
  }
  builder.RegisterService(service->get());
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) {
    log::error("cannot listen on %s", flags.listen);
    return 1;
  }
  auto* health = server->GetHealthCheckService();
  health->SetServingStatus("", true);
  health->SetServingStatus("dsflash.v1.ExpertStore", true);
  log::info("ready: serving dsflash.v1.ExpertStore on %s (fds on %s); metrics %s%s", flags.listen, flags.fd_socket,
            flags.metrics == "off" ? "" : "on ", flags.metrics);

  while (g_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  log::info("signal %d: stopping (%zu session(s) open)", g_signal.load(), (*service)->sessions());
  health->SetServingStatus("dsflash.v1.ExpertStore", false);
  (*service)->shutdown();
  (*store)->stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  log::info("stopped");
  return 0;
}
