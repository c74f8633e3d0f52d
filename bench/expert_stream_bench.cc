// Streamed experts on the GPU (issue 7), rows appended to bench/results.csv: the real
// dsflash-expertstore with a device arena of a given fraction of the model's experts as a
// second process, this process on the CUDA backend importing the arena; a prefill, then a
// decode of N tokens (greedy). Per arena fraction: hit rate, misses and bytes read per token,
// time blocked in acquire per token, decode tok/s against the all-resident CUDA run of the same
// file and against the bound the disk sets for the bytes read (raw O_DIRECT rate). The routing
// is the model's own; its measured skew (share of picks taken by the top quarter of a layer's
// experts) and token-to-token reuse are reported with it.
//   expert_stream_bench --model M.gguf --store-bin PATH [--fractions 0.25,0.5,1] [--prompt 64]
//                       [--decode 256] [--readers 4] [--prefetch on|off] [--host-cache 0]
//                       [--eviction lfu|lru|random-oldest:F] [--trace-out F] [--csv F] [--label L]
//                       [--expert-tiles true|false]
// --trace-out writes the decode's routing (the same for every fraction) for expert_cache_sim;
// --host-cache F gives the store a pinned host-memory tier of F x all experts (--host-cache);
// --expert-tiles false has the store keep the GGUF order (run with DSF_WEIGHT_TILES=0, so the
// resident run reads the same order).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "dsflash/v1/expertstore.grpc.pb.h"
#include "expertstore_svc/slice_map.h"
#include "expertstore_svc/staging.h"
#include "inference_svc/expert_client/expert_client.h"
#include "inference_svc/model/model.h"
#include "bench/slice_read.h"
#include "bench/store_process.h"
#include "tools/dsflash/args.h"
#include "tools/dsflash/bench_csv.h"

namespace dsflash {
namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// The client with its acquires recorded: (layer, expert) per acquire, the time spent in them,
// and whether each expert was resident when its layer's routing was known. The model names a
// layer's routed experts in one prefetch() before acquiring them (a next-layer hint comes
// earlier and is overwritten by it): the residency then is the hit or miss of the pick — the
// client's own hit count is higher, as the layer's misses load in parallel and later acquires
// find them ready.
class Recorder final : public model::ExpertSource {
 public:
  explicit Recorder(std::unique_ptr<expertclient::ExpertClient> c) : c_(std::move(c)) {}
  StatusOr<model::ExpertWeights> acquire(int layer, int expert) override {
    const auto key = std::make_pair(layer, expert);
    auto it = at_routing_.find(key);
    const bool hit = it != at_routing_.end() ? it->second : c_->resident(layer, expert);
    if (it != at_routing_.end()) at_routing_.erase(it);
    const auto t0 = Clock::now();
    auto w = c_->acquire(layer, expert);
    blocked_s += secs(t0, Clock::now());
    if (recording) {
      picks[layer].back().insert(expert);
      ++(hit ? routed_hits : routed_misses);
    }
    return w;
  }
  void release(int layer, int expert) override { c_->release(layer, expert); }
  void prefetch(int layer, const std::vector<int>& experts) override {
    for (int e : experts) at_routing_[std::make_pair(layer, e)] = c_->resident(layer, e);
    c_->prefetch(layer, experts);
  }
  kernels::Backend memory() const override { return c_->memory(); }
  size_t lease_budget() const override { return c_->lease_budget(); }
  const uint8_t* arena_base() const override { return c_->arena_base(); }
  expertclient::ExpertClient& client() { return *c_; }
  void next_token(int n_layer) {
    if (picks.empty()) picks.resize(static_cast<size_t>(n_layer));
    for (auto& p : picks) p.emplace_back();
  }
  double blocked_s = 0;
  bool recording = false;
  uint64_t routed_hits = 0, routed_misses = 0;
  std::vector<std::vector<std::set<int>>> picks;  // [layer][token] experts acquired

 private:
  std::unique_ptr<expertclient::ExpertClient> c_;
  std::map<std::pair<int, int>, bool> at_routing_;
};

StatusOr<v1::StoreStats> store_stats(const std::string& sock) {
  auto stub = v1::ExpertStore::NewStub(grpc::CreateChannel(sock, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::StoreStats st;
  const grpc::Status s = stub->GetStats(&ctx, v1::GetStatsRequest(), &st);
  if (!s.ok()) return absl::UnavailableError(s.error_message());
  return st;
}

// Raw O_DIRECT pread rate of up to 4 GiB of expert slices with `threads` threads (bytes/s).
StatusOr<double> disk_rate(const gguf::Model& m, const expertstore::SliceMap& map, int threads) {
  std::vector<bench::SliceRef> refs;
  uint64_t total = 0;
  for (uint32_t l = 0; l < map.n_layers() && total < (4ull << 30); ++l) {
    for (uint32_t e = 0; e < map.n_experts() && total < (4ull << 30); ++e) {
      ASSIGN_OR_RETURN(const expertstore::ExpertSlices s, map.at(l, e));
      for (const auto* x : {&s.gate, &s.up, &s.down}) refs.push_back({x->shard, x->file_offset, x->bytes}), total += x->bytes;
    }
  }
  return bench::raw_pread_rate(m, refs, threads);
}

std::vector<int32_t> prompt_of(const config::ModelConfig& c, int64_t n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(3 + (i * 7919) % (c.n_vocab - 3));
  return p;
}

double tokens_per_s(const std::vector<double>& step_ms) {
  double total_ms = 0;
  for (double x : step_ms) total_ms += x;
  return total_ms > 0 ? static_cast<double>(step_ms.size()) / (total_ms / 1e3) : 0.0;
}

// Prefill, then n greedy decode steps; returns the step times (ms). `before_decode` runs between.
StatusOr<std::vector<double>> decode(const model::Model& m, int64_t n_prompt, int64_t n,
                                     const std::function<void()>& before_decode, Recorder* rec) {
  auto seq = m.new_sequence();
  if (seq == nullptr) return absl::ResourceExhaustedError("no device memory for a sequence");
  std::vector<float> logits;
  RETURN_IF_ERROR(m.forward(*seq, prompt_of(m.config(), n_prompt), false, &logits));
  before_decode();
  std::vector<double> ms;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (rec != nullptr) rec->next_token(static_cast<int>(m.config().n_layer));
    const auto t0 = Clock::now();
    RETURN_IF_ERROR(m.forward(*seq, {next}, false, &logits));
    ms.push_back(secs(t0, Clock::now()) * 1e3);
  }
  return ms;
}

// The decode's routing as a trace for expert_cache_sim --trace (see read_trace there).
Status write_trace(const std::string& path, const std::vector<std::vector<std::set<int>>>& picks,
                   const config::ModelConfig& c) {
  std::ofstream out(path);
  out << "dsflash-routing-trace 1 " << c.n_layer << " " << c.n_expert << " " << c.n_expert_used << "\n";
  const size_t tokens = picks.empty() ? 0 : picks[0].size();
  for (size_t t = 0; t < tokens; ++t) {
    for (const auto& layer : picks) {
      if (layer[t].size() != c.n_expert_used) return absl::InternalError("a decode token did not acquire top-k experts");
      for (int e : layer[t]) out << e << " ";
      out << "\n";
    }
  }
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

// Share of a layer's picks taken by its top quarter of experts, and experts a token shares with
// the previous token, both averaged over layers.
std::pair<double, double> routing_stats(const std::vector<std::vector<std::set<int>>>& picks, uint32_t n_expert) {
  double top_share = 0, reuse = 0;
  for (const auto& layer : picks) {
    std::vector<double> count(n_expert, 0);
    double total = 0, shared = 0;
    for (size_t t = 0; t < layer.size(); ++t) {
      for (int e : layer[t]) count[static_cast<size_t>(e)] += 1, total += 1;
      if (t > 0) {
        for (int e : layer[t]) shared += layer[t - 1].count(e);
      }
    }
    std::sort(count.rbegin(), count.rend());
    double top = 0;
    for (size_t i = 0; i < std::max<size_t>(1, n_expert / 4); ++i) top += count[i];
    top_share += total > 0 ? top / total : 0;
    reuse += layer.size() > 1 ? shared / static_cast<double>(layer.size() - 1) : 0;
  }
  const double n = std::max<size_t>(1, picks.size());
  return {top_share / n, reuse / n};
}

// What every arena fraction's run shares: the flags, the model and the all-resident figures.
struct Setup {
  std::string model, csv, label, eviction, tiles, store_bin;
  int64_t n_prompt = 64, n_decode = 256;
  int readers = 4;
  bool prefetch = false;
  double host_frac = 0;
  std::optional<std::string> trace_out;
  std::unique_ptr<gguf::Model> file;
  config::ModelConfig cfg;
  std::optional<expertstore::SliceMap> map;
  double disk = 0, resident_tps = 0, resident_median_ms = 0;
};

// One arena fraction: a real store process with that budget, the model streaming from it, the
// decode measured and its rows appended.
Status run_fraction(const Setup& s, double frac, bool write_trace_out) {
  const uint64_t all = uint64_t{s.cfg.n_layer} * s.cfg.n_expert;
  const uint64_t slots = std::max<uint64_t>(s.cfg.n_expert_used, static_cast<uint64_t>(frac * static_cast<double>(all) + 0.5));
  const std::string dir = std::filesystem::temp_directory_path() / absl::StrCat("dsf_stream_", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string sock = "unix:" + dir + "/store.sock";
  std::vector<std::string> args = {s.store_bin, "--model", s.model, "--listen", sock, "--metrics", "off",
                                   "--budget", std::to_string(slots * s.map->slot_bytes()), "--arena", "device",
                                   "--reader-threads", std::to_string(s.readers), "--eviction", s.eviction,
                                   "--expert-tiles", s.tiles};
  const uint64_t tier_slots = static_cast<uint64_t>(s.host_frac * static_cast<double>(all) + 0.5);
  if (tier_slots > 0) args.insert(args.end(), {"--host-cache", std::to_string(tier_slots * s.map->slot_bytes())});
  bench::StoreProcess proc;
  RETURN_IF_ERROR(proc.start(args));
  ASSIGN_OR_RETURN(const std::string fp, s.file->fingerprint("_exps."));
  auto client = std::make_unique<expertclient::ExpertClient>(
      expertclient::ClientOptions{.address = sock, .model_fingerprint = fp, .device_arena = true}, s.cfg);
  RETURN_IF_ERROR(client->wait_connected(std::chrono::seconds(60)));
  auto rec_owned = std::make_unique<Recorder>(std::move(client));
  Recorder* rec = rec_owned.get();
  ASSIGN_OR_RETURN(auto m, model::Model::load(*s.file, std::move(rec_owned),
                                              model::LoadOptions{kernels::Backend::kCuda, s.prefetch}));
  uint64_t hits0 = 0, misses0 = 0, bytes0 = 0, evict0 = 0, loads0 = 0, tier0 = 0;
  ASSIGN_OR_RETURN(const auto ms, decode(*m, s.n_prompt, s.n_decode, [&] {
    hits0 = rec->client().hits(), misses0 = rec->client().misses();
    auto st = store_stats(sock);
    if (st.ok()) bytes0 = st->bytes_read(), evict0 = st->evictions(), loads0 = st->loads(), tier0 = st->host_tier_hits();
    rec->blocked_s = 0;
    rec->recording = true;
  }, rec));
  ASSIGN_OR_RETURN(const v1::StoreStats st, store_stats(sock));
  const double n = static_cast<double>(s.n_decode);
  const double hits = static_cast<double>(rec->routed_hits), misses = static_cast<double>(rec->routed_misses);
  const double client_hits = static_cast<double>(rec->client().hits() - hits0);
  const double client_misses = static_cast<double>(rec->client().misses() - misses0);
  const double loads = static_cast<double>(st.loads() - loads0) / n;
  const double bytes = static_cast<double>(st.bytes_read() - bytes0) / n;
  const double tps = tokens_per_s(ms);
  const auto [top_share, reuse] = routing_stats(rec->picks, s.cfg.n_expert);
  if (write_trace_out) RETURN_IF_ERROR(write_trace(*s.trace_out, rec->picks, s.cfg));
  const std::string config = absl::StrCat(s.label, " experts=", all, " arena=", static_cast<int>(frac * 100 + 0.5), "% slots=",
                                          slots, " prompt=", s.n_prompt, " decode=", s.n_decode, " readers=", s.readers, " eviction=", s.eviction, " host-cache=", static_cast<int>(s.host_frac * 100 + 0.5), "%",
                                          " prefetch=", s.prefetch ? "on" : "off", " tiles=", s.tiles, " top-quarter share=", top_share,
                                          " reuse=", reuse);
  std::fprintf(stderr, "%s\n", config.c_str());
  RETURN_IF_ERROR(tools::append_bench_rows(
      s.csv, "expert_streaming", config,
      {{"hit_rate", hits / std::max(1.0, hits + misses), "ratio (resident when the layer's routing was known)"},
       {"misses_per_token", misses / n, "experts"},
       {"loads_per_token", loads, "experts (demand and prefetch)"},
       {"client_hit_rate", client_hits / std::max(1.0, client_hits + client_misses),
        "ratio (resident at acquire, after the layer's misses were asked for together)"},
       {"bytes_read_per_token", bytes / 1e6, "MB"},
       {"evictions_per_token", static_cast<double>(st.evictions() - evict0) / n, "experts"},
       {"blocked_on_experts_per_token", rec->blocked_s * 1e3 / n, "ms"},
       {"decode_tokens_per_s", tps, "tok/s"},
       {"decode_step_ms_median", tools::median(ms), "ms"},
       {"decode_graph_replays", static_cast<double>(m->decode_graph_replays()), "steps (graph segment chains)"},
       {"resident_decode_tokens_per_s", s.resident_tps, "tok/s"},
       {"resident_decode_step_ms_median", s.resident_median_ms, "ms"},
       {"host_tier_hits_per_token", static_cast<double>(st.host_tier_hits() - tier0) / n, "experts"},
       {"vs_resident", tps / s.resident_tps, "ratio"},
       {"disk_read_rate", s.disk / 1e6, "MB/s"},
       {"disk_bound_tokens_per_s", bytes > 0 ? s.disk / bytes : 0.0, "tok/s"},
       {"vs_disk_bound", bytes > 0 ? tps / (s.disk / bytes) : 0.0, "ratio"}}));
  m.reset();
  std::filesystem::remove_all(dir);
  return absl::OkStatus();
}

Status run_bench(const tools::Args& a) {
  Setup s;
  s.model = a.get_or("model", ""), s.csv = a.get_or("csv", "bench/results.csv");
  s.store_bin = a.get_or("store-bin", "");
  s.n_prompt = std::atoll(a.get_or("prompt", "64").c_str()), s.n_decode = std::atoll(a.get_or("decode", "256").c_str());
  s.readers = std::atoi(a.get_or("readers", "4").c_str());
  s.prefetch = a.get_or("prefetch", "off") == "on";
  s.host_frac = std::atof(a.get_or("host-cache", "0").c_str());
  s.eviction = a.get_or("eviction", "lfu");      // the store's default
  s.tiles = a.get_or("expert-tiles", "true");    // the store's default
  if (a.has("trace-out")) s.trace_out = *a.get("trace-out");
  if (s.host_frac < 0 || s.host_frac > 1) return absl::InvalidArgumentError("--host-cache: a fraction of the experts in [0, 1]");
  ASSIGN_OR_RETURN(s.file, gguf::Model::open(s.model));
  ASSIGN_OR_RETURN(s.cfg, config::from_gguf(*s.file));
  ASSIGN_OR_RETURN(s.map, expertstore::SliceMap::build(*s.file, s.cfg));
  s.label = a.get_or("label", s.cfg.name);
  ASSIGN_OR_RETURN(s.disk, disk_rate(*s.file, *s.map, s.readers));
  std::fprintf(stderr, "raw O_DIRECT read rate: %.0f MB/s (%d threads)\n", s.disk / 1e6, s.readers);
  // The all-resident rate (graph decode) of the same file.
  // Both rates are decoded tokens / total decode time over the same number of steps.
  {
    ASSIGN_OR_RETURN(auto m, model::Model::load(*s.file, nullptr, model::LoadOptions{kernels::Backend::kCuda}));
    ASSIGN_OR_RETURN(const auto ms, decode(*m, s.n_prompt, s.n_decode, [] {}, nullptr));
    s.resident_tps = tokens_per_s(ms), s.resident_median_ms = tools::median(ms);
  }
  std::fprintf(stderr, "all resident: %.2f tok/s (median step %.2f ms)\n", s.resident_tps, s.resident_median_ms);
  bool trace_written = false;
  for (absl::string_view f : absl::StrSplit(a.get_or("fractions", "0.25,0.5,1"), ',')) {
    const double frac = std::atof(std::string(f).c_str());
    if (frac <= 0 || frac > 1) return absl::InvalidArgumentError("--fractions: values in (0, 1]");
    RETURN_IF_ERROR(run_fraction(s, frac, s.trace_out.has_value() && !trace_written));
    trace_written = true;
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace dsflash

int main(int argc, char** argv) {
  std::vector<std::string> v(argv + 1, argv + argc);
  auto a = dsflash::tools::Args::parse(v, {}, {"model", "store-bin", "fractions", "prompt", "decode", "readers", "prefetch",
                                               "csv", "label", "trace-out", "host-cache", "eviction", "expert-tiles"});
  if (!a.ok() || !a->has("model") || !a->has("store-bin")) {
    std::fprintf(stderr,
                 "usage: expert_stream_bench --model M.gguf --store-bin PATH [--fractions 0.25,0.5,1] [--prompt 64] "
                 "[--decode 256] [--readers 4] [--prefetch on|off] [--host-cache 0] [--eviction lfu] [--trace-out F] [--csv F] "
                 "[--label L] [--expert-tiles true|false]\n");
    return 2;
  }
  const dsflash::Status s = dsflash::run_bench(*a);
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
