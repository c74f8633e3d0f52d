// Expert-arena eviction policies on a synthetic V4.1 routing trace, through the store's own
// SlotTable (lock_victim / publish / try_acquire / release): strict LRU against a random victim
// among the oldest 2, 6 and 12 % of the unleased slots and against aged least-frequent (the
// store's default), with Belady's offline optimum as the floor, for arenas of 25, 50 and 90 % of the experts. Hit rates depend on the policy and the
// trace, not on the machine, so this runs anywhere (issue 7: "decide the eviction policy by
// measurement"); the decode-time cost of the misses is measured on the GPU separately.
//
// The trace is calibrated to spec/peers-perf.md §2.4: 40 layers x 256 experts, top-6 routing;
// per layer a Zipf(s) popularity over a random permutation of the experts (s = 0.8: the top
// 25 % of experts take ~60 % of the picks, as measured on V4.1 layers 0-3); each pick first
// repeats one of the previous token's experts in that layer with probability `reuse` (V4.1:
// ~1 of 6 shared between adjacent tokens), and every 32 tokens a few popularity ranks swap, so
// the working set keeps growing as it does in a real generation. The first `warm` tokens (the
// prompt) fill the arena and are not counted.
//
// With --trace PATH it replays a routing trace recorded on the GPU (expert_stream_bench
// --trace-out) instead, warm-up capped at an eighth of its tokens.
//
//   expert_cache_sim [--tokens N] [--warm N] [--zipf S] [--reuse P] [--seed N] [--trace PATH] [--csv PATH]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "expertstore_svc/slot_table.h"
#include "tools/dsflash/bench_csv.h"

namespace dsflash::expertstore {
namespace {

struct TraceOptions {
  uint32_t layers = 40, experts = 256, top = 6;
  int tokens = 1024, warm = 128;
  double zipf = 0.8, reuse = 0.1;
  uint64_t seed = 1;
};

// trace[(t * o.layers + l) * o.top + k] = the k-th expert token t routes to in layer l (distinct).
std::vector<uint16_t> make_trace(const TraceOptions& o) {
  std::mt19937_64 rng(o.seed);
  std::vector<double> weight(o.experts);
  for (uint32_t r = 0; r < o.experts; ++r) weight[r] = 1.0 / std::pow(r + 1.0, o.zipf);
  std::vector<std::vector<uint16_t>> rank_to_expert(o.layers, std::vector<uint16_t>(o.experts));
  for (auto& perm : rank_to_expert) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
  }
  std::discrete_distribution<uint32_t> pick_rank(weight.begin(), weight.end());
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<uint16_t> trace(static_cast<size_t>(o.tokens) * o.layers * o.top);
  for (int t = 0; t < o.tokens; ++t) {
    if (t > 0 && t % 32 == 0) {  // popularity drift: a few ranks swap in every layer
      for (auto& perm : rank_to_expert) {
        for (int s = 0; s < 4; ++s) std::swap(perm[rng() % o.experts], perm[rng() % o.experts]);
      }
    }
    for (uint32_t l = 0; l < o.layers; ++l) {
      uint16_t* out = &trace[(static_cast<size_t>(t) * o.layers + l) * o.top];
      const uint16_t* prev = t > 0 ? out - o.layers * o.top : nullptr;
      for (uint32_t k = 0; k < o.top; ++k) {
        for (;;) {
          const uint16_t e = prev != nullptr && u(rng) < o.reuse ? prev[rng() % o.top] : rank_to_expert[l][pick_rank(rng)];
          if (std::find(out, out + k, e) == out + k) {
            out[k] = e;
            break;
          }
        }
      }
    }
  }
  return trace;
}

// A recorded trace (expert_stream_bench --trace-out): a line "dsflash-routing-trace 1 LAYERS
// EXPERTS TOP", then per token and layer a line of TOP distinct expert ids. Sets o's geometry
// and token count.
StatusOr<std::vector<uint16_t>> read_trace(const std::string& path, TraceOptions& o) {
  std::ifstream in(path);
  std::string magic;
  int version = 0;
  if (!(in >> magic >> version >> o.layers >> o.experts >> o.top) || magic != "dsflash-routing-trace" || version != 1 ||
      o.layers == 0 || o.experts == 0 || o.experts > 65535 || o.top == 0 || o.top > o.experts) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a routing trace (dsflash-routing-trace 1 L E K ...)"));
  }
  std::vector<uint16_t> trace;
  for (uint32_t e; in >> e;) {
    if (e >= o.experts) return absl::InvalidArgumentError(absl::StrCat(path, ": expert ", e, " out of range"));
    trace.push_back(static_cast<uint16_t>(e));
  }
  const size_t per_token = size_t{o.layers} * o.top;
  if (!in.eof() || trace.empty() || trace.size() % per_token != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", trace.size(), " ids, not whole tokens of ", per_token));
  }
  for (size_t g = 0; g < trace.size(); g += o.top) {
    std::vector<uint16_t> set(trace.begin() + static_cast<std::ptrdiff_t>(g), trace.begin() + static_cast<std::ptrdiff_t>(g + o.top));
    std::sort(set.begin(), set.end());
    if (std::adjacent_find(set.begin(), set.end()) != set.end()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": an expert repeats within one layer's picks"));
    }
  }
  o.tokens = static_cast<int>(trace.size() / per_token);
  return trace;
}

struct Result {
  uint64_t hits = 0, misses = 0;
};

// The trace through a SlotTable of n_slots: each layer's experts are leased together (as a
// decode step holds them while its kernels run) and released after the layer.
Result simulate(const std::vector<uint16_t>& trace, const TraceOptions& o, uint32_t n_slots, double oldest_fraction,
                bool least_frequent) {
  const size_t tb = SlotTable::table_bytes(o.layers, o.experts, n_slots), lb = SlotTable::lease_bytes(o.layers, o.experts, n_slots);
  std::unique_ptr<uint8_t, decltype(&std::free)> table(static_cast<uint8_t*>(std::aligned_alloc(64, (tb + 63) / 64 * 64)),
                                                       &std::free);
  std::unique_ptr<uint8_t, decltype(&std::free)> leases(static_cast<uint8_t*>(std::aligned_alloc(64, (lb + 63) / 64 * 64)),
                                                        &std::free);
  SlotTable st = SlotTable::create(table.get(), leases.get(), o.layers, o.experts, n_slots, 1);
  st.set_eviction(oldest_fraction, o.seed);
  if (least_frequent) st.set_least_frequent(16ull * o.layers * o.experts);  // as the store
  Result r;
  std::vector<Lease> held;
  for (int t = 0; t < o.tokens; ++t) {
    for (uint32_t l = 0; l < o.layers; ++l) {
      for (uint32_t k = 0; k < o.top; ++k) {
        const uint32_t e = trace[(static_cast<size_t>(t) * o.layers + l) * o.top + k];
        std::optional<Lease> lease = st.try_acquire(0, l, e, st.next_tick());
        const bool hit = lease.has_value();
        if (!hit) {
          const std::optional<uint32_t> slot = st.lock_victim();
          if (!slot) std::abort();  // more experts leased at once than slots: not a configuration run here
          const uint64_t tick = st.next_tick();
          st.publish(*slot, l, e, tick);
          lease = st.try_acquire(0, l, e, tick);
        }
        if (t >= o.warm) ++(hit ? r.hits : r.misses);
        held.push_back(*lease);
      }
      for (const Lease& h : held) st.release(h);
      held.clear();
    }
  }
  return r;
}

// Belady's MIN: on a miss with a full arena, evict the resident expert used farthest in the
// future (never one of the layer's experts already leased).
Result belady(const std::vector<uint16_t>& trace, const TraceOptions& o, uint32_t n_slots) {
  const size_t n = trace.size();
  std::vector<uint32_t> id(n);
  for (size_t i = 0; i < n; ++i) id[i] = static_cast<uint32_t>((i / o.top) % o.layers * o.experts + trace[i]);
  std::vector<size_t> next(n), last(o.layers * o.experts, SIZE_MAX);
  for (size_t i = n; i-- > 0;) {
    next[i] = last[id[i]];
    last[id[i]] = i;
  }
  std::vector<size_t> next_use(o.layers * o.experts, SIZE_MAX);
  std::vector<bool> resident(o.layers * o.experts, false);
  std::set<std::pair<size_t, uint32_t>, std::greater<>> by_next;  // farthest first
  Result r;
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t x = id[i];
    const bool counted = static_cast<int>(i / (o.layers * o.top)) >= o.warm;
    if (resident[x]) {
      if (counted) ++r.hits;
      by_next.erase({next_use[x], x});
    } else {
      if (counted) ++r.misses;
      if (count == n_slots) {
        const size_t group = i / o.top * o.top;  // the layer's picks so far stay
        auto it = by_next.begin();
        while (std::find(id.begin() + static_cast<std::ptrdiff_t>(group), id.begin() + static_cast<std::ptrdiff_t>(i),
                         it->second) != id.begin() + static_cast<std::ptrdiff_t>(i)) {
          ++it;
        }
        resident[it->second] = false;
        by_next.erase(it);
        --count;
      }
      resident[x] = true;
      ++count;
    }
    next_use[x] = next[i];
    by_next.insert({next_use[x], x});
  }
  return r;
}

// What the trace looks like, to compare with the measurements it is calibrated to.
void describe(const std::vector<uint16_t>& trace, const TraceOptions& o, std::vector<tools::BenchRow>* rows) {
  double overlap = 0;
  std::vector<uint64_t> uses(o.layers * o.experts, 0);
  std::vector<bool> seen(o.layers * o.experts, false);
  uint64_t distinct = 0, distinct_warm = 0;
  for (int t = 0; t < o.tokens; ++t) {
    for (uint32_t l = 0; l < o.layers; ++l) {
      const uint16_t* cur = &trace[(static_cast<size_t>(t) * o.layers + l) * o.top];
      for (uint32_t k = 0; k < o.top; ++k) {
        const uint32_t x = l * o.experts + cur[k];
        ++uses[x];
        if (!seen[x]) {
          seen[x] = true;
          ++distinct;
        }
        if (t > 0) overlap += std::count(cur - o.layers * o.top, cur - o.layers * o.top + o.top, cur[k]);
      }
    }
    if (t + 1 == o.warm) distinct_warm = distinct;
  }
  double top25 = 0, total = 0;
  for (uint32_t l = 0; l < o.layers; ++l) {
    std::vector<uint64_t> u(uses.begin() + l * o.experts, uses.begin() + (l + 1) * o.experts);
    std::sort(u.rbegin(), u.rend());
    top25 += std::accumulate(u.begin(), u.begin() + o.experts / 4, 0.0);
    total += std::accumulate(u.begin(), u.end(), 0.0);
  }
  rows->push_back({"adjacent_token_shared_experts_per_layer", overlap / ((o.tokens - 1.0) * o.layers), absl::StrCat("experts of ", o.top)});
  rows->push_back({"top25pct_experts_share_of_picks", top25 / total, "fraction"});
  rows->push_back({"distinct_experts_after_warm", static_cast<double>(distinct_warm), "experts"});
  rows->push_back({"distinct_experts_at_end", static_cast<double>(distinct), "experts"});
}

int run(int argc, char** argv) {
  TraceOptions o;
  std::string csv = "bench/results.csv", trace_path;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    bool ok = true;
    if (a == "--tokens") ok = absl::SimpleAtoi(v, &o.tokens) && o.tokens > 1;
    else if (a == "--warm") ok = absl::SimpleAtoi(v, &o.warm) && o.warm >= 0;
    else if (a == "--zipf") ok = absl::SimpleAtod(v, &o.zipf) && o.zipf >= 0;
    else if (a == "--reuse") ok = absl::SimpleAtod(v, &o.reuse) && o.reuse >= 0 && o.reuse <= 1;
    else if (a == "--seed") ok = absl::SimpleAtoi(v, &o.seed);
    else if (a == "--csv") csv = v;
    else if (a == "--trace") trace_path = v;
    else ok = false;
    if (!ok) {
      std::fprintf(stderr, "expert_cache_sim: bad argument %s %s\n", a.c_str(), v.c_str());
      return 2;
    }
  }
  std::vector<uint16_t> trace;
  std::string base;
  if (!trace_path.empty()) {
    auto t = read_trace(trace_path, o);
    if (!t.ok()) {
      std::fprintf(stderr, "expert_cache_sim: %s\n", std::string(t.status().message()).c_str());
      return 2;
    }
    trace = std::move(*t);
    o.warm = std::min(o.warm, o.tokens / 8);
    base = absl::StrCat("recorded trace ", std::filesystem::path(trace_path).filename().string(), " layers=", o.layers,
                        " experts=", o.experts, " top=", o.top, " tokens=", o.tokens, " warm=", o.warm);
  }
  if (o.warm >= o.tokens) {
    std::fprintf(stderr, "expert_cache_sim: --warm must be below --tokens\n");
    return 2;
  }
  if (trace.empty()) {
    trace = make_trace(o);
    base = absl::StrCat("V4.1-like trace layers=40 experts=256 top=6 zipf=", o.zipf, " reuse=", o.reuse,
                        " tokens=", o.tokens, " warm=", o.warm, " seed=", o.seed);
  }
  std::vector<tools::BenchRow> trace_rows;
  describe(trace, o, &trace_rows);
  for (const auto& r : trace_rows) std::printf("trace %-42s %10.3f %s\n", r.metric.c_str(), r.value, r.unit.c_str());
  Status st = tools::append_bench_rows(csv, "expert_cache_sim", base, trace_rows);
  const double counted = static_cast<double>(o.tokens - o.warm);
  for (double arena : {0.25, 0.5, 0.9}) {
    const uint32_t slots = static_cast<uint32_t>(arena * o.layers * o.experts);
    struct Policy {
      std::string name;
      double fraction;  // < 0: Belady
      bool least_frequent = false;
    };
    for (const Policy& p : {Policy{"lru", 0}, Policy{"random-oldest-2%", 0.02}, Policy{"random-oldest-6%", 0.06},
                            Policy{"random-oldest-12%", 0.12}, Policy{"lfu-aged", 0, true}, Policy{"belady", -1}}) {
      const Result r = p.fraction < 0 ? belady(trace, o, slots) : simulate(trace, o, slots, p.fraction, p.least_frequent);
      const double hit = static_cast<double>(r.hits) / static_cast<double>(r.hits + r.misses);
      std::printf("arena %3.0f%% (%5u slots) %-18s hit rate %.4f, %6.2f misses per token\n", arena * 100, slots,
                  p.name.c_str(), hit, r.misses / counted);
      const std::string config = absl::StrCat(base, " arena=", arena * 100, "% slots=", slots, " policy=", p.name);
      if (st.ok()) {
        st = tools::append_bench_rows(csv, "expert_cache_sim", config,
                                      {{"hit_rate", hit, "fraction"}, {"misses_per_token", r.misses / counted, "experts"}});
      }
    }
  }
  if (!st.ok()) {
    std::fprintf(stderr, "expert_cache_sim: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace dsflash::expertstore

int main(int argc, char** argv) { return dsflash::expertstore::run(argc, argv); }
