// Expert store benchmarks (issue 4), rows appended to bench/results.csv:
//  - hit path: a real dsflash-expertstore process and an ExpertClient in this process;
//    acquire + release of 6 experts of one layer, all resident (no RPC), median and p99,
//    next to one gRPC round trip on the same socket for scale;
//  - miss path: every expert of the model loaded through an in-process Store (reader threads,
//    staging ring, O_DIRECT, copy into the arena) against raw O_DIRECT pread of the same
//    slices with the same number of threads, bytes/s, median of --runs.
//   expertstore_bench --model M.gguf --store-bin PATH [--runs N] [--threads R] [--csv F] [--label L]
//                     [--arena host|device]   (the miss path's arena; the hit path uses host)
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <mutex>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "dsflash/v1/expertstore.grpc.pb.h"
#include "expertstore_svc/store.h"
#include "inference_svc/expert_client/expert_client.h"
#include "tools/dsflash/args.h"
#include "bench/slice_read.h"
#include "bench/store_process.h"
#include "tools/dsflash/bench_csv.h"

namespace dsflash {
namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Every expert through the store (demand loads, all queued at once per layer): bytes/s.
StatusOr<double> store_load_rate(const std::string& model, int threads, const std::string& arena) {
  ASSIGN_OR_RETURN(auto store, expertstore::Store::open(model, expertstore::StoreOptions{.budget_bytes = 1ull << 40,
                                                                                         .reader_threads = threads,
                                                                                         .arena = arena}));
  const auto& c = store->config();
  std::mutex mu;
  double read_s = 0, copy_s = 0, total_s = 0;
  store->set_load_observer([&](const expertstore::LoadEvent& ev) {
    std::lock_guard<std::mutex> l(mu);
    read_s += ev.read_s;
    copy_s += ev.copy_s;
    total_s += ev.total_s - ev.queue_s;
  });
  const auto t0 = Clock::now();
  for (uint32_t l = 0; l < c.n_layer; ++l) {
    for (uint32_t e = 0; e < c.n_expert; ++e) store->prefetch(l, e, /*demand=*/true);
  }
  for (uint32_t l = 0; l < c.n_layer; ++l) {
    for (uint32_t e = 0; e < c.n_expert; ++e) {
      ASSIGN_OR_RETURN(const expertstore::Lease lease, store->acquire(expertstore::Store::kLocal, l, e));
      RETURN_IF_ERROR(store->release(lease));
    }
  }
  const double s = secs(t0, Clock::now());
  std::fprintf(stderr, "store: %.3f s wall; per-load sums over %d readers: read %.3f s, copy %.3f s, in service %.3f s\n", s,
               threads, read_s, copy_s, total_s);
  return static_cast<double>(store->stats().bytes_read) / s;
}

}  // namespace

Status run_bench(const tools::Args& a) {
  const std::string model = a.get_or("model", ""), csv = a.get_or("csv", "bench/results.csv");
  const int runs = std::atoi(a.get_or("runs", "5").c_str()), threads = std::atoi(a.get_or("threads", "2").c_str());
  ASSIGN_OR_RETURN(auto file, gguf::Model::open(model));
  ASSIGN_OR_RETURN(const config::ModelConfig cfg, config::from_gguf(*file));
  ASSIGN_OR_RETURN(const expertstore::SliceMap map, expertstore::SliceMap::build(*file, cfg));
  std::vector<bench::SliceRef> slices;
  for (uint32_t l = 0; l < cfg.n_layer; ++l) {
    for (uint32_t e = 0; e < cfg.n_expert; ++e) {
      ASSIGN_OR_RETURN(const expertstore::ExpertSlices s, map.at(l, e));
      for (const auto* x : {&s.gate, &s.up, &s.down}) slices.push_back({x->shard, x->file_offset, x->bytes});
    }
  }
  const std::string label = a.get_or("label", cfg.name), arena = a.get_or("arena", "host");
  // ---- miss path ----
  std::vector<double> raw, via_store;
  for (int r = 0; r < runs; ++r) {
    ASSIGN_OR_RETURN(const double x, bench::raw_pread_rate(*file, slices, threads));
    ASSIGN_OR_RETURN(const double y, store_load_rate(model, threads, arena));
    raw.push_back(x);
    via_store.push_back(y);
    std::fprintf(stderr, "run %d: raw %.0f MB/s, store %.0f MB/s\n", r, x / 1e6, y / 1e6);
  }
  const double raw_m = tools::median(raw), store_m = tools::median(via_store);
  RETURN_IF_ERROR(tools::append_bench_rows(
      csv, "expertstore_miss",
      absl::StrCat(label, " experts=", cfg.n_layer * cfg.n_expert, " expert_bytes=", map.expert_bytes(), " readers=", threads,
                   " O_DIRECT arena=", arena, " runs=", runs),
      {{"store_load_rate", store_m / 1e6, "MB/s"}, {"raw_pread_rate", raw_m / 1e6, "MB/s"},
       {"store_vs_raw", store_m / raw_m, "ratio"}}));

  // ---- hit path: a real store process ----
  const std::string dir = std::filesystem::temp_directory_path() / absl::StrCat("dsf_bench_", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string sock = "unix:" + dir + "/store.sock";
  std::vector<std::string> args = {a.get_or("store-bin", ""), "--model", model, "--listen", sock, "--metrics", "off",
                                   "--budget", "1T"};
  bench::StoreProcess proc;
  RETURN_IF_ERROR(proc.start(args));
  ASSIGN_OR_RETURN(const std::string fp, file->fingerprint("_exps."));
  expertclient::ExpertClient client(expertclient::ClientOptions{.address = sock, .model_fingerprint = fp}, cfg);
  RETURN_IF_ERROR(client.wait_connected(std::chrono::seconds(30)));
  const int used = static_cast<int>(cfg.n_expert_used);
  for (uint32_t l = 0; l < cfg.n_layer; ++l) {  // make everything resident
    for (int e = 0; e < static_cast<int>(cfg.n_expert); ++e) {
      RETURN_IF_ERROR(client.acquire(static_cast<int>(l), e).status());
      client.release(static_cast<int>(l), e);
    }
  }
  std::mt19937 rng(7);
  std::vector<double> hit_us;
  for (int i = 0; i < 20000; ++i) {
    const int l = static_cast<int>(rng() % cfg.n_layer), e0 = static_cast<int>(rng() % cfg.n_expert);
    const auto t0 = Clock::now();
    for (int k = 0; k < used; ++k) RETURN_IF_ERROR(client.acquire(l, (e0 + k) % static_cast<int>(cfg.n_expert)).status());
    for (int k = 0; k < used; ++k) client.release(l, (e0 + k) % static_cast<int>(cfg.n_expert));
    hit_us.push_back(secs(t0, Clock::now()) * 1e6);
  }
  auto stub = dsflash::v1::ExpertStore::NewStub(grpc::CreateChannel(sock, grpc::InsecureChannelCredentials()));
  std::vector<double> rpc_us;
  for (int i = 0; i < 2000; ++i) {
    grpc::ClientContext ctx;
    dsflash::v1::PrefetchResponse resp;
    const auto t0 = Clock::now();
    const grpc::Status st = stub->Prefetch(&ctx, dsflash::v1::PrefetchRequest(), &resp);
    if (!st.ok()) return absl::UnavailableError(st.error_message());
    rpc_us.push_back(secs(t0, Clock::now()) * 1e6);
  }
  std::filesystem::remove_all(dir);
  return tools::append_bench_rows(
      csv, "expertstore_hit", absl::StrCat(label, " acquire+release of ", used, " experts of one layer, 20000 iterations"),
      {{"hit_path_median", tools::median(hit_us), "us"},
       {"hit_path_p99", tools::percentile(hit_us, 0.99), "us"},
       {"grpc_roundtrip_median", tools::median(rpc_us), "us"},
       {"grpc_roundtrip_p99", tools::percentile(rpc_us, 0.99), "us"}});
}

}  // namespace dsflash

int main(int argc, char** argv) {
  std::vector<std::string> v(argv + 1, argv + argc);
  auto args = dsflash::tools::Args::parse(v, {}, {"model", "store-bin", "runs", "threads", "csv", "label", "arena"});
  if (!args.ok() || !args->has("model") || !args->has("store-bin")) {
    std::fprintf(stderr, "usage: expertstore_bench --model M.gguf --store-bin PATH [--runs N] [--threads R] [--csv F] [--label L] [--arena host|device]\n");
    return 2;
  }
  const dsflash::Status s = dsflash::run_bench(*args);
  if (!s.ok()) std::fprintf(stderr, "expertstore_bench: %s\n", std::string(s.message()).c_str());
  return s.ok() ? 0 : 1;
}
