// The expert store core on real files: bytes in slots equal bytes in the file, misses load,
// hits do not, prefetches run behind demand, a budget too small for one layer's top-k is
// refused, and the golden model run through a store whose arena is smaller than the model
// (forcing evictions) gives bit-identical logits to the in-process GGUF expert source.
#include <unistd.h>

#include <cstring>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <fstream>
#include <thread>

#include "common/gguf/gguf.h"
#include "expertstore_svc/local_source.h"
#include "expertstore_svc/store.h"
#include "gtest/gtest.h"
#include "inference_svc/model/model.h"
#include "tests/golden_data.h"
#include "tests/test_util.h"

namespace dsflash::expertstore {
namespace {

std::string golden_model() { return testing::golden_dir() + "/tiny_a.gguf"; }

TEST(Store, SlotsHoldTheFileBytes) {
  auto store = Store::open(golden_model(), StoreOptions{.budget_bytes = 64 << 20, .reader_threads = 2});
  ASSERT_TRUE(store.ok()) << store.status();
  Store& s = **store;
  auto file = gguf::Model::open(golden_model());
  ASSERT_TRUE(file.ok());
  auto lease = s.acquire(Store::kLocal, 4, 1);
  ASSERT_TRUE(lease.ok()) << lease.status();
  const ExpertSlices sl = *s.slices().at(4, 1);
  const uint8_t* slot = s.arena().host_data() + uint64_t{lease->slot} * s.slices().slot_bytes();
  for (const Slice* x : {&sl.gate, &sl.up, &sl.down}) {
    std::vector<uint8_t> want(x->bytes);
    ASSERT_TRUE((*file)->shard(x->shard).pread(x->file_offset, want.data(), want.size()).ok());
    EXPECT_EQ(0, std::memcmp(slot + x->slot_offset, want.data(), want.size()));
    EXPECT_FALSE(x->tiles);  // a host arena keeps the GGUF order
    EXPECT_EQ(static_cast<uint64_t>(x->rows) * *quant::row_bytes(x->type, static_cast<uint64_t>(x->cols)), x->bytes);
  }
  EXPECT_EQ(sl.gate.rows, s.config().expert_ffn);
  EXPECT_EQ(sl.down.cols, s.config().expert_ffn);
  ASSERT_TRUE(s.release(*lease).ok());
  EXPECT_EQ(s.release(*lease).code(), absl::StatusCode::kFailedPrecondition);  // not held twice
  auto again = s.acquire(Store::kLocal, 4, 1);  // now a hit
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(s.release(*again).ok());
  const StoreStats st = s.stats();
  EXPECT_EQ(st.loads, 1u);
  EXPECT_EQ(st.hits, 1u);
  EXPECT_EQ(st.misses, 1u);
  EXPECT_EQ(st.leased, 0u);
  EXPECT_EQ(s.acquire(Store::kLocal, 6, 0).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(s.acquire(Store::kLocal, 0, 4).status().code(), absl::StatusCode::kOutOfRange);
  s.prefetch(5, 2);
  for (int i = 0; i < 200 && !s.table().resident_slot(5, 2); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_NE(s.table().resident_slot(5, 2), 0u);
  EXPECT_TRUE(s.table().verify_integrity().ok());
}

// Sessions: leases belong to a session; closing it (its client died) drops them all, and
// the slots become evictable again.
TEST(Store, ClosingASessionDropsItsLeases) {
  auto store = Store::open(golden_model(), StoreOptions{.budget_bytes = 64 << 20, .reader_threads = 1});
  ASSERT_TRUE(store.ok()) << store.status();
  Store& s = **store;
  auto a = s.open_session(), b = s.open_session();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->row, b->row);
  ASSERT_TRUE(s.acquire(*a, 0, 0).ok());
  ASSERT_TRUE(s.acquire(*a, 0, 1).ok());
  ASSERT_TRUE(s.acquire(*a, 0, 1).ok());
  ASSERT_TRUE(s.acquire(*b, 0, 1).ok());
  EXPECT_EQ(s.table().session_leases(a->row), 3u);
  EXPECT_EQ(s.stats().leased, 2u);
  EXPECT_EQ(s.stats().sessions, 2u);
  EXPECT_EQ(s.close_session(*a), 3u);
  EXPECT_EQ(s.stats().leased, 1u);  // b's lease on (0, 1) holds
  EXPECT_EQ(s.close_session(*b), 1u);
  EXPECT_EQ(s.stats().leased, 0u);
  // A closed session gets no new lease (an Acquire that outlived its client's session).
  const auto late = s.acquire(*a, 0, 0);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable) << late.status();
  EXPECT_NE(late.status().message().find("closed"), std::string::npos) << late.status();
  EXPECT_EQ(s.stats().leased, 0u);
  // Every session can be opened; one more is refused with a clear error.
  std::vector<SessionRow> all;
  for (;;) {
    auto x = s.open_session();
    if (!x.ok()) {
      EXPECT_EQ(x.status().code(), absl::StatusCode::kResourceExhausted);
      break;
    }
    all.push_back(*x);
  }
  EXPECT_EQ(all.size(), kSessions - 1);
  // A row closed and opened again belongs to its new session only: calls made with the old
  // session (a late Acquire or Release of a dead client) neither lease, release nor close it.
  const SessionRow old = all.front();
  EXPECT_EQ(s.close_session(old), 0u);
  auto again = s.open_session();
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(again->row, old.row);
  EXPECT_NE(again->epoch, old.epoch);
  auto mine = s.acquire(*again, 0, 2);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(s.acquire(old, 0, 2).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.release(old, mine->slot, mine->generation).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.close_session(old), 0u);
  EXPECT_EQ(s.table().session_leases(again->row), 1u);
  EXPECT_EQ(s.stats().sessions, kSessions - 1);
  EXPECT_TRUE(s.release(*again, mine->slot, mine->generation).ok());
  EXPECT_EQ(s.close_session(*again), 0u);
  EXPECT_TRUE(s.table().verify_integrity().ok());
}

// Buffered and O_DIRECT reads give the same slot bytes; a shard truncated after opening
// fails that load with an error naming the file, and the store keeps serving.
TEST(Store, ReadFailuresFailTheLoadNotTheStore) {
  testing::TempDir dir;
  const std::string copy = dir.path() + "/m.gguf";
  {
    std::ifstream in(golden_model(), std::ios::binary);
    std::ofstream out(copy, std::ios::binary);
    out << in.rdbuf();
  }
  for (bool direct : {false, true}) {
    auto store = Store::open(copy, StoreOptions{.budget_bytes = 64 << 20, .reader_threads = 1, .direct_io = direct});
    ASSERT_TRUE(store.ok()) << store.status();
    auto lease = (*store)->acquire(Store::kLocal, 1, 2);
    ASSERT_TRUE(lease.ok()) << lease.status();
    const ExpertSlices sl = *(*store)->slices().at(1, 2);
    const uint8_t* slot = (*store)->arena().host_data() + uint64_t{lease->slot} * (*store)->slices().slot_bytes();
    std::vector<uint8_t> want(sl.down.bytes);
    ASSERT_TRUE((*store)->model().shard(0).pread(sl.down.file_offset, want.data(), want.size()).ok());
    EXPECT_EQ(0, std::memcmp(slot + sl.down.slot_offset, want.data(), want.size())) << "direct=" << direct;
  }
  auto store = Store::open(copy, StoreOptions{.budget_bytes = 64 << 20, .reader_threads = 1});
  ASSERT_TRUE(store.ok());
  const ExpertSlices last = *(*store)->slices().at(5, 3);
  ASSERT_EQ(0, ::truncate(copy.c_str(), static_cast<off_t>(last.gate.file_offset)));
  auto bad = (*store)->acquire(Store::kLocal, 5, 3);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("m.gguf"), std::string::npos) << bad.status();
  EXPECT_TRUE((*store)->acquire(Store::kLocal, 0, 0).ok());  // still serving
  EXPECT_EQ((*store)->stats().load_failures, 1u);
}

// Demand misses go before queued prefetches: with one reader held on its first load, 22
// prefetches and then a demand are queued; the demand is the next load.
TEST(Store, DemandMissesGoBeforePrefetches) {
  // Declared before the store: its reader calls the observer until the store is destroyed.
  std::mutex mu;
  std::condition_variable cv;
  bool hold = true;
  std::vector<std::pair<uint32_t, bool>> order;  // (layer * 4 + expert, demand)
  auto store = Store::open(golden_model(), StoreOptions{.budget_bytes = 64 << 20, .reader_threads = 1});
  ASSERT_TRUE(store.ok());
  (*store)->set_load_observer([&](const LoadEvent& ev) {
    std::unique_lock<std::mutex> l(mu);
    order.emplace_back(ev.layer * 4 + ev.expert, ev.demand);
    cv.notify_all();
    cv.wait(l, [&] { return !hold; });
  });
  (*store)->prefetch(0, 0);
  {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return !order.empty(); });  // the reader is now held inside load 1
  }
  for (uint32_t id = 1; id <= 22; ++id) (*store)->prefetch(id / 4, id % 4);
  std::thread demand([&] { EXPECT_TRUE((*store)->acquire(Store::kLocal, 5, 3).ok()); });
  while ((*store)->stats().queued_demand == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ((*store)->stats().queued_prefetch, 22u);
  {
    std::lock_guard<std::mutex> l(mu);
    hold = false;
  }
  cv.notify_all();
  demand.join();
  std::unique_lock<std::mutex> l(mu);  // the observer runs just after the waiter is woken
  cv.wait_for(l, std::chrono::seconds(5), [&] { return order.size() >= 2; });
  ASSERT_GE(order.size(), 2u);
  EXPECT_EQ(order[0], std::make_pair(0u, false));
  EXPECT_EQ(order[1], std::make_pair(23u, true));  // the demand jumped 22 prefetches
}

// Expert tensors of an unexpected shape, or absent: a startup error naming the tensor.
TEST(Store, RefusesMisshapenOrMissingExpertTensors) {
  auto src = gguf::Model::open(golden_model());
  ASSERT_TRUE(src.ok());
  testing::TempDir dir;
  for (const bool drop : {false, true}) {
    gguf::Writer w;
    for (const auto& [k, v] : (*src)->metadata()) w.set(k, v);
    for (const gguf::TensorInfo& t : (*src)->tensors()) {
      std::vector<uint64_t> ne = t.ne;
      uint64_t bytes = t.n_bytes;
      if (t.name == "blk.3.ffn_down_exps.weight") {
        if (drop) continue;
        ne[2] = 3;  // one expert short
        bytes = t.n_bytes / 4 * 3;
      }
      const gguf::Model* m = src->get();
      const gguf::TensorInfo* ti = &t;
      ASSERT_TRUE(w.add_tensor(t.name, ne, t.type, [m, ti, bytes](uint8_t* dst, uint64_t n) {
                     return n == bytes ? m->read(*ti, 0, dst, n) : absl::InternalError("size");
                   }).ok());
    }
    const std::string path = dir.file(drop ? "dropped.gguf" : "misshapen.gguf");
    ASSERT_TRUE(w.write(path).ok());
    auto store = Store::open(path, StoreOptions{.budget_bytes = 64 << 20});
    ASSERT_FALSE(store.ok()) << path;
    EXPECT_NE(store.status().message().find("blk.3.ffn_down_exps"), std::string::npos) << store.status();
  }
}

// The staging ring: aligned buffers, take blocks until one is given back, occupancy, and a
// pinning failure is an error that says how to fix it.
TEST(StagingRing, BuffersCirculateAndPinFailuresAreErrors) {
  auto ring = StagingRing::create(2, 5000, nullptr);
  ASSERT_TRUE(ring.ok());
  EXPECT_EQ((*ring)->buffer_bytes(), 8192u);
  uint8_t* a = (*ring)->take();
  uint8_t* b = (*ring)->take();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % kDirectAlign, 0u);
  EXPECT_NE(a, b);
  EXPECT_EQ((*ring)->in_use(), 2u);
  std::atomic<uint8_t*> got{nullptr};
  std::thread waiter([&] { got = (*ring)->take(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(got.load(), nullptr);  // blocked: both buffers out
  (*ring)->give(a);
  waiter.join();
  EXPECT_EQ(got.load(), a);
  (*ring)->give(b);
  (*ring)->give(a);
  EXPECT_EQ((*ring)->in_use(), 0u);

  struct Unpinnable : Arena {
    std::string mechanism() const override { return "test"; }
    uint64_t bytes() const override { return 0; }
    int fd() const override { return -1; }
    uint8_t* host_data() const override { return nullptr; }
    Status copy_in(uint64_t, const uint8_t*, size_t) override { return absl::OkStatus(); }
    Status pin(void*, size_t) override { return absl::ResourceExhaustedError("mlock refused"); }
  };
  Unpinnable arena;
  auto refused = StagingRing::create(2, 5000, &arena);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--pin-staging=false"), std::string::npos) << refused.status();
}

TEST(Store, RefusesABudgetBelowOneLayersTopK) {
  auto store = Store::open(golden_model(), StoreOptions{.budget_bytes = 100000, .reader_threads = 1});
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("top-2"), std::string::npos) << store.status();
  auto missing = Store::open(testing::golden_dir() + "/nope.gguf", StoreOptions{});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

// The host tier: with an arena of 3 slots and a host cache of all 24 experts, the first pass
// over every expert reads the disk (and fills the tier), later passes are served from the
// tier with no disk read, and the slots still hold the file's bytes. A tier smaller than one
// expert is refused.
TEST(Store, HostTierServesReloadsWithoutDiskReads) {
  auto probe = Store::open(golden_model(), StoreOptions{.budget_bytes = 64 << 20});
  ASSERT_TRUE(probe.ok());
  const uint64_t slot = (*probe)->slices().slot_bytes();
  EXPECT_EQ(Store::open(golden_model(), StoreOptions{.budget_bytes = 3 * slot, .host_cache_bytes = slot - 1})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  auto store = Store::open(golden_model(),
                           StoreOptions{.budget_bytes = 3 * slot, .reader_threads = 2, .host_cache_bytes = 24 * slot});
  ASSERT_TRUE(store.ok()) << store.status();
  Store& s = **store;
  auto file = gguf::Model::open(golden_model());
  ASSERT_TRUE(file.ok());
  uint64_t bytes_after_first = 0;
  for (int pass = 0; pass < 3; ++pass) {
    for (uint32_t l = 0; l < 6; ++l) {
      for (uint32_t e = 0; e < 4; ++e) {
        auto lease = s.acquire(Store::kLocal, l, e);
        ASSERT_TRUE(lease.ok()) << lease.status();
        const ExpertSlices sl = *s.slices().at(l, e);
        const uint8_t* data = s.arena().host_data() + uint64_t{lease->slot} * slot;
        for (const Slice* x : {&sl.gate, &sl.up, &sl.down}) {
          std::vector<uint8_t> want(x->bytes);
          ASSERT_TRUE((*file)->shard(x->shard).pread(x->file_offset, want.data(), want.size()).ok());
          ASSERT_EQ(0, std::memcmp(data + x->slot_offset, want.data(), want.size())) << "pass " << pass;
        }
        ASSERT_TRUE(s.release(*lease).ok());
      }
    }
    if (pass == 0) bytes_after_first = s.stats().bytes_read;
  }
  const StoreStats st = s.stats();
  EXPECT_EQ(st.host_tier_slots, 24u);
  EXPECT_EQ(st.loads, 72u);  // 3 slots: every acquire of the cycle misses the arena
  EXPECT_EQ(st.host_tier_hits, 48u);
  EXPECT_EQ(st.bytes_read, bytes_after_first);  // nothing read from disk after the first pass
  EXPECT_TRUE(s.table().verify_integrity().ok());
}

// Least-frequent eviction (the default) with a layer's misses loaded together: a slot loaded
// and not yet leased is not the next load's victim although its expert has no use counted
// (it would be, and its client would find it gone again and again); a popular expert goes
// instead when nothing else can.
TEST(Store, LoadsAwaitingTheirLeaseAreNotEvictedFirst) {
  auto probe = Store::open(golden_model(), StoreOptions{.budget_bytes = 64 << 20});
  ASSERT_TRUE(probe.ok());
  const uint64_t slot = (*probe)->slices().slot_bytes();
  auto store = Store::open(golden_model(), StoreOptions{.budget_bytes = 4 * slot, .reader_threads = 1});
  ASSERT_TRUE(store.ok()) << store.status();
  Store& s = **store;
  ASSERT_TRUE(s.table().header().n_slots == 4);
  auto use = [&](uint32_t l, uint32_t e, int n) {
    for (int i = 0; i < n; ++i) {
      auto lease = s.acquire(Store::kLocal, l, e);
      ASSERT_TRUE(lease.ok()) << lease.status();
      ASSERT_TRUE(s.release(*lease).ok());
    }
  };
  use(0, 0, 10);  // popular
  use(0, 1, 10);
  use(2, 0, 1);
  use(2, 1, 1);
  const uint64_t loads0 = s.stats().loads;
  for (uint32_t e = 0; e < 3; ++e) ASSERT_TRUE(s.prefetch(1, e, true));  // a layer's misses, asked together
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (s.stats().loads < loads0 + 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(s.stats().loads, loads0 + 3);
  for (uint32_t e = 0; e < 3; ++e) EXPECT_NE(s.table().resident_slot(1, e), 0u) << "expert " << e << " of layer 1";
  EXPECT_EQ(s.table().resident_slot(2, 0) + s.table().resident_slot(2, 1), 0u);  // the rarely used went
  EXPECT_EQ((s.table().resident_slot(0, 0) != 0) + (s.table().resident_slot(0, 1) != 0), 1);  // and one popular
  for (uint32_t e = 0; e < 3; ++e) use(1, e, 1);
  EXPECT_EQ(s.stats().loads, loads0 + 3);  // each lease found its load
  EXPECT_TRUE(s.table().verify_integrity().ok());
}

TEST(Store, SmallArenaGivesIdenticalLogits) {
  const auto& g = testing::Golden::get();
  auto file = gguf::Model::open(golden_model());
  ASSERT_TRUE(file.ok());
  auto ref_model = model::Model::load(**file);
  ASSERT_TRUE(ref_model.ok());
  // 24 experts (6 layers x 4) but room for 3: every layer evicts.
  auto probe = Store::open(golden_model(), StoreOptions{.budget_bytes = 64 << 20});
  ASSERT_TRUE(probe.ok());
  const uint64_t slot = (*probe)->slices().slot_bytes();
  auto store = Store::open(golden_model(), StoreOptions{.budget_bytes = 3 * slot, .reader_threads = 2});
  ASSERT_TRUE(store.ok()) << store.status();
  auto source = std::make_unique<LocalStoreSource>(**store);
  LocalStoreSource* src = source.get();
  auto store_model = model::Model::load(**file, std::move(source));
  ASSERT_TRUE(store_model.ok());
  const auto tokens = g.ints("prompt.len17.tokens");
  auto a = (*ref_model)->new_sequence(), b = (*store_model)->new_sequence();
  std::vector<float> la, lb;
  ASSERT_TRUE((*ref_model)->forward(*a, tokens, true, &la).ok());
  ASSERT_TRUE((*store_model)->forward(*b, tokens, true, &lb).ok());
  EXPECT_EQ(la, lb);
  for (int32_t t : {5, 77, 300}) {
    ASSERT_TRUE((*ref_model)->forward(*a, {t}, false, &la).ok());
    ASSERT_TRUE((*store_model)->forward(*b, {t}, false, &lb).ok());
    EXPECT_EQ(la, lb);
  }
  EXPECT_EQ(src->held(), 0u);  // every lease released after its layer
  const StoreStats st = (*store)->stats();
  EXPECT_EQ(st.slots, 3u);
  EXPECT_GT(st.loads, 3u);  // evictions happened
  EXPECT_EQ(st.leased, 0u);
  EXPECT_TRUE((*store)->table().verify_integrity().ok());
}

}  // namespace
}  // namespace dsflash::expertstore
