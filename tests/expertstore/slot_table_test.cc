// Expert store building blocks: the slice map over real GGUF files (offsets and bytes equal
// the merged tensors' per-expert slices), and the shared slot table (hits, LRU eviction
// among unleased slots, leases never evicted, integrity under concurrent clients).
#include <atomic>
#include <random>
#include <thread>

#include "common/config/config.h"
#include "common/gguf/gguf.h"
#include "expertstore_svc/slice_map.h"
#include "expertstore_svc/slot_table.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace dsflash::expertstore {
namespace {

TEST(SliceMap, GoldenModelSlicesMatchTheMergedTensors) {
  auto m = gguf::Model::open(testing::golden_dir() + "/tiny_a.gguf");
  ASSERT_TRUE(m.ok());
  auto c = config::from_gguf(**m);
  ASSERT_TRUE(c.ok());
  auto map = SliceMap::build(**m, *c);
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->n_layers(), 6u);
  EXPECT_EQ(map->n_experts(), 4u);
  const gguf::TensorInfo* down = (*m)->find_tensor("blk.2.ffn_down_exps.weight");
  auto s = map->at(2, 3);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->down.bytes, down->n_bytes / 4);
  EXPECT_EQ(s->down.file_offset, down->file_offset + 3 * down->n_bytes / 4);
  EXPECT_EQ(s->gate.type, quant::GgmlType::kMXFP4);
  EXPECT_EQ(s->up.slot_offset % kSliceAlign, 0u);
  EXPECT_GE(map->slot_bytes(), s->down.slot_offset + s->down.bytes);
  // The bytes at the slice are the expert's rows of the merged tensor.
  std::vector<uint8_t> a(s->gate.bytes), b(s->gate.bytes);
  ASSERT_TRUE((*m)->shard(s->gate.shard).pread(s->gate.file_offset, a.data(), a.size()).ok());
  const gguf::TensorInfo* gate = (*m)->find_tensor("blk.2.ffn_gate_exps.weight");
  ASSERT_TRUE((*m)->read(*gate, 3 * s->gate.bytes, b.data(), b.size()).ok());
  EXPECT_EQ(a, b);
  EXPECT_EQ(map->at(6, 0).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(map->at(0, 4).status().code(), absl::StatusCode::kOutOfRange);
}

void* aligned(std::vector<uint8_t>& m) {
  return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(m.data()) + 63) & ~uintptr_t{63});
}

struct Table {
  explicit Table(uint32_t layers, uint32_t experts, uint32_t slots)
      : mem(SlotTable::table_bytes(layers, experts, slots) + 64),
        lease_mem(SlotTable::lease_bytes(layers, experts, slots) + 64),
        table(SlotTable::create(aligned(mem), aligned(lease_mem), layers, experts, slots, 4096)) {}
  std::vector<uint8_t> mem, lease_mem;
  SlotTable table;
};

// Store side of a miss: lock a victim, "load", publish.
std::optional<uint32_t> load(SlotTable& t, uint32_t layer, uint32_t expert, uint64_t tick) {
  const auto slot = t.lock_victim();
  if (slot) t.publish(*slot, layer, expert, tick);
  return slot;
}

// The store and a client (another mapping of the same regions) tick one clock: a hit the
// client takes after the store's loads is the most recent use, whatever either has counted.
TEST(SlotTable, StoreAndClientShareOneUseClock) {
  Table tb(1, 8, 2);
  SlotTable& store = tb.table;
  auto client = SlotTable::attach(aligned(tb.mem), tb.mem.size() - 64, aligned(tb.lease_mem), tb.lease_mem.size() - 64);
  ASSERT_TRUE(client.ok()) << client.status();
  for (int i = 0; i < 1000; ++i) store.next_tick();  // the store has been busy
  ASSERT_TRUE(load(store, 0, 1, store.next_tick()));
  ASSERT_TRUE(load(store, 0, 2, store.next_tick()));
  const uint64_t before = store.next_tick();
  auto lease = client->try_acquire(0, 0, 1, client->next_tick());  // the client's first tick
  ASSERT_TRUE(lease.has_value());
  client->release(*lease);
  EXPECT_GT(client->next_tick(), before);
  // (0,2) was used before the client's hit on (0,1): it goes first.
  ASSERT_TRUE(load(store, 0, 3, store.next_tick()));
  EXPECT_EQ(store.resident_slot(0, 2), 0u);
  EXPECT_NE(store.resident_slot(0, 1), 0u);
}

TEST(SlotTable, HitsMissesAndLruAmongUnleased) {
  Table tb(2, 8, 3);
  SlotTable& t = tb.table;
  EXPECT_FALSE(t.try_acquire(0, 0, 1, 1).has_value());  // miss
  ASSERT_TRUE(load(t, 0, 1, 1));
  ASSERT_TRUE(load(t, 0, 2, 2));
  ASSERT_TRUE(load(t, 1, 5, 3));
  auto lease = t.try_acquire(0, 0, 1, 10);  // hit; expert (0,1) is now the most recent
  ASSERT_TRUE(lease.has_value());
  t.release(*lease);
  // Full: the least recently used is (0,2) (tick 2).
  ASSERT_TRUE(load(t, 1, 7, 11));
  EXPECT_EQ(t.resident_slot(0, 2), 0u);
  EXPECT_NE(t.resident_slot(0, 1), 0u);
  EXPECT_NE(t.resident_slot(1, 7), 0u);
  EXPECT_TRUE(t.verify_integrity().ok());
  // Leased slots are never chosen; with everything leased there is no victim.
  auto a = t.try_acquire(0, 0, 1, 12), b = t.try_acquire(0, 1, 5, 13), c = t.try_acquire(0, 1, 7, 14);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(t.leased_slots(), 3u);
  EXPECT_FALSE(t.lock_victim().has_value());
  t.release(*b);
  const auto v = load(t, 0, 3, 15);
  ASSERT_TRUE(v);
  EXPECT_EQ(*v, b->slot);  // the only unleased slot
  EXPECT_EQ(t.resident_slot(1, 5), 0u);
  t.release(*a);
  t.release(*c);
  EXPECT_TRUE(t.verify_integrity().ok());
  EXPECT_EQ(t.leased_slots(), 0u);
}

// Random victim among the oldest fraction: over many evictions of a full table with uses
// 1..100, only the 10 oldest unleased slots are ever chosen, each of them some time, and a
// leased one never.
TEST(SlotTable, RandomVictimAmongTheOldest) {
  Table tb(1, 200, 100);
  SlotTable& t = tb.table;
  t.set_eviction(0.1, 7);
  for (uint32_t e = 0; e < 100; ++e) ASSERT_TRUE(load(t, 0, e, 1 + e));  // expert e used at tick 1 + e
  auto pinned = t.try_acquire(0, 0, 3, 2);                              // keeps its old tick, leased
  ASSERT_TRUE(pinned.has_value());
  std::vector<int> chosen(100, 0);
  for (int i = 0; i < 400; ++i) {
    bool evicted = false;
    const auto slot = t.lock_victim(&evicted);
    ASSERT_TRUE(slot.has_value());
    ASSERT_TRUE(evicted);
    ++chosen[*slot];
    // Put the same expert back with its old tick, so the table is unchanged for the next draw.
    uint32_t expert = 0;
    while (t.resident_slot(0, expert) != 0 || expert == 3) ++expert;
    t.publish(*slot, 0, expert, 1 + expert);
  }
  int distinct = 0;
  for (uint32_t s = 0; s < 100; ++s) {
    if (chosen[s] == 0) continue;
    ++distinct;
    EXPECT_NE(s, pinned->slot);
  }
  EXPECT_EQ(distinct, 10);  // ceil(0.1 * 99 unleased) = 10 oldest: experts 0..10 without the leased 3
  t.release(*pinned);
  EXPECT_TRUE(t.verify_integrity().ok());
}

// Least-frequent eviction: the victim is the resident expert leased least often (resident or
// not, a failed acquire does not count), whatever its recency — LRU would take the oldest —
// and the counts halve once the use clock passes the aging period.
TEST(SlotTable, LeastFrequentKeepsThePopularExperts) {
  Table tb(1, 8, 3);
  SlotTable& t = tb.table;
  t.set_least_frequent(1000);
  for (uint32_t e = 0; e < 3; ++e) ASSERT_TRUE(load(t, 0, e, t.next_tick()));
  auto use = [&](uint32_t e, int n) {
    for (int i = 0; i < n; ++i) {
      auto l = t.try_acquire(0, 0, e, t.next_tick());
      ASSERT_TRUE(l.has_value());
      t.release(*l);
    }
  };
  use(0, 5);  // popular, but the least recently used of the three
  use(1, 3);
  use(2, 1);  // the most recent
  EXPECT_FALSE(t.try_acquire(0, 0, 7, t.next_tick()).has_value());  // not resident: not counted
  EXPECT_EQ(t.uses(0, 0), 5u);
  EXPECT_EQ(t.uses(0, 2), 1u);
  EXPECT_EQ(t.uses(0, 7), 0u);
  const uint32_t slot_of_2 = t.resident_slot(0, 2) - 1;
  bool evicted = false;
  auto victim = t.lock_victim(&evicted);
  ASSERT_TRUE(victim.has_value());
  EXPECT_TRUE(evicted);
  EXPECT_EQ(*victim, slot_of_2);
  t.publish(*victim, 0, 7, t.next_tick());
  EXPECT_TRUE(t.verify_integrity().ok());
  // The same table under LRU evicts expert 0 (its last use is the oldest).
  Table lru(1, 8, 3);
  for (uint32_t e = 0; e < 3; ++e) ASSERT_TRUE(load(lru.table, 0, e, e + 1));
  uint64_t tick = 10;
  for (auto [e, n] : {std::pair{0u, 5}, std::pair{1u, 3}, std::pair{2u, 1}}) {
    for (int i = 0; i < n; ++i) lru.table.release(*lru.table.try_acquire(0, 0, e, ++tick));
  }
  const uint32_t slot_of_0 = lru.table.resident_slot(0, 0) - 1;  // before lock_victim unmaps it
  EXPECT_EQ(lru.table.lock_victim(), std::optional<uint32_t>(slot_of_0));
  // Aging: past the period the next eviction halves every count first.
  for (int i = 0; i < 1000; ++i) t.next_tick();
  ASSERT_TRUE(t.lock_victim().has_value());
  EXPECT_EQ(t.uses(0, 0), 2u);
  EXPECT_EQ(t.uses(0, 1), 1u);
}

TEST(SlotTable, AttachChecksTheRegion) {
  Table tb(2, 8, 3);
  const size_t tbytes = SlotTable::table_bytes(2, 8, 3), lbytes = SlotTable::lease_bytes(2, 8, 3);
  auto ok = SlotTable::attach(aligned(tb.mem), tbytes, aligned(tb.lease_mem), lbytes);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->header().n_slots, 3u);
  EXPECT_FALSE(SlotTable::attach(aligned(tb.mem), 100, aligned(tb.lease_mem), lbytes).ok());
  EXPECT_FALSE(SlotTable::attach(aligned(tb.mem), tbytes, aligned(tb.lease_mem), 100).ok());
  std::vector<uint8_t> junk(4096, 0x5a);
  EXPECT_FALSE(SlotTable::attach(junk.data(), junk.size(), aligned(tb.lease_mem), lbytes).ok());
}

// Leases are per session: a second client's lease keeps a slot after the first session is
// cleared; clearing drops exactly the session's counts; hits are counted per session.
TEST(SlotTable, SessionsOwnTheirLeases) {
  Table tb(1, 4, 2);
  SlotTable& t = tb.table;
  ASSERT_TRUE(load(t, 0, 0, 1));
  ASSERT_TRUE(load(t, 0, 1, 2));
  auto a1 = t.try_acquire(3, 0, 0, 3), a2 = t.try_acquire(3, 0, 1, 4), b = t.try_acquire(5, 0, 1, 5);
  ASSERT_TRUE(a1 && a2 && b);
  t.count_hit(3);
  EXPECT_EQ(t.session_hits(3), 1u);
  EXPECT_EQ(t.session_leases(3), 2u);
  EXPECT_FALSE(t.lock_victim().has_value());
  EXPECT_EQ(t.clear_session(3), 2u);
  EXPECT_EQ(t.session_hits(3), 0u);
  EXPECT_EQ(t.leased_slots(), 1u);
  bool evicted = false;
  const auto v = t.lock_victim(&evicted);
  ASSERT_TRUE(v);
  EXPECT_TRUE(evicted);
  EXPECT_EQ(*v, a1->slot);  // b's slot stays
  t.abandon(*v);
  t.release(*b);
  EXPECT_EQ(t.leased_slots(), 0u);
  EXPECT_TRUE(t.verify_integrity().ok()) << t.verify_integrity();
}

// Clients hold leases while the store keeps evicting and refilling: a leased slot's contents
// (here: a payload naming the expert, written by the store when it publishes) never change
// under a lease, and the table stays consistent.
TEST(SlotTable, LeasesHoldUnderConcurrentEviction) {
  constexpr uint32_t kExperts = 32, kSlots = 6;
  Table tb(1, kExperts, kSlots);
  SlotTable& t = tb.table;
  std::vector<std::atomic<int32_t>> payload(kSlots);
  for (auto& p : payload) p = -1;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> tick{1}, hits{0}, violations{0};
  std::mutex store_mu;  // the store serialises its own refills
  auto client = [&](int seed) {
    std::mt19937 rng(seed);
    while (!stop) {
      const uint32_t e = rng() % kExperts;
      auto lease = t.try_acquire(static_cast<uint32_t>(seed), 0, e, tick++);
      if (!lease) {
        std::lock_guard<std::mutex> l(store_mu);
        if (t.resident_slot(0, e) == 0) {
          if (auto slot = t.lock_victim()) {
            payload[*slot] = static_cast<int32_t>(e);  // "copy the expert into the slot"
            t.publish(*slot, 0, e, tick++);
          }
        }
        continue;
      }
      ++hits;
      for (int i = 0; i < 50; ++i) {
        if (payload[lease->slot].load() != static_cast<int32_t>(e)) ++violations;
      }
      t.release(*lease);
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back(client, i + 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  stop = true;
  for (auto& th : threads) th.join();
  EXPECT_EQ(violations.load(), 0u);
  EXPECT_GT(hits.load(), 100u);
  EXPECT_EQ(t.leased_slots(), 0u);
  EXPECT_TRUE(t.verify_integrity().ok()) << t.verify_integrity();
}

}  // namespace
}  // namespace dsflash::expertstore
