// Expert store core (see store.h).
#include "expertstore_svc/store.h"

#include <fcntl.h>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace dsflash::expertstore {

StatusOr<std::unique_ptr<Store>> Store::open(const std::string& model_path, StoreOptions o) {
  std::unique_ptr<Store> s(new Store());
  ASSIGN_OR_RETURN(s->model_, gguf::Model::open(model_path, gguf::File::Options{.map = false}));
  ASSIGN_OR_RETURN(s->cfg_, config::from_gguf(*s->model_));
  ASSIGN_OR_RETURN(s->slices_, SliceMap::build(*s->model_, s->cfg_));
  const uint64_t slot = s->slices_.slot_bytes();
  const uint64_t n_slots = o.budget_bytes / slot;
  if (n_slots < s->cfg_.n_expert_used) {
    return absl::InvalidArgumentError(absl::StrCat("an expert budget of ", o.budget_bytes, " bytes holds ", n_slots,
                                                   " slots of ", slot, " bytes; one layer's top-", s->cfg_.n_expert_used,
                                                   " needs ", s->cfg_.n_expert_used * slot));
  }
  const uint32_t slots = static_cast<uint32_t>(std::min<uint64_t>(n_slots, uint64_t{s->cfg_.n_layer} * s->cfg_.n_expert));
  ASSIGN_OR_RETURN(s->arena_, ipc::SharedRegion::create("dsflash-expert-arena", slot * slots));
  ASSIGN_OR_RETURN(s->table_mem_, ipc::SharedRegion::create(
                                      "dsflash-slot-table", SlotTable::bytes(s->cfg_.n_layer, s->cfg_.n_expert, slots)));
  s->table_ = SlotTable::create(s->table_mem_.data(), s->cfg_.n_layer, s->cfg_.n_expert, slots, slot);
  s->stats_.slots = slots;
  for (int i = 0; i < std::max(1, o.reader_threads); ++i) s->readers_.emplace_back([p = s.get()] { p->reader_loop(); });
  log::info("expert store: %u slots of %.2f MiB (%.1f MiB arena) for %u layers x %u experts", slots, slot / 1048576.0,
            slot * slots / 1048576.0, s->cfg_.n_layer, s->cfg_.n_expert);
  return s;
}

Store::~Store() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  slot_cv_.notify_all();
  for (auto& t : readers_) t.join();
}

// Reads the three slices of (layer, expert) into a victim slot and publishes it. Waits for a
// release when every slot is leased.
Status Store::load_into(uint32_t layer, uint32_t expert) {
  ASSIGN_OR_RETURN(const ExpertSlices sl, slices_.at(layer, expert));
  std::optional<uint32_t> slot;
  {
    std::unique_lock<std::mutex> l(mu_);
    if (!slot_cv_.wait_for(l, std::chrono::seconds(30), [&] { return stop_ || (slot = table_.lock_victim()); })) {
      return absl::ResourceExhaustedError("every expert slot stayed leased for 30 s");
    }
    if (stop_) return absl::UnavailableError("the expert store is stopping");
  }
  uint8_t* dst = arena_.data() + uint64_t{*slot} * slices_.slot_bytes();
  for (const Slice* s : {&sl.gate, &sl.up, &sl.down}) {
    const Status st = model_->shard(s->shard).pread(s->file_offset, dst + s->slot_offset, s->bytes);
    if (!st.ok()) {
      table_.abandon(*slot);
      return st;
    }
    (void)::posix_fadvise(model_->shard(s->shard).fd(), static_cast<off_t>(s->file_offset), static_cast<off_t>(s->bytes),
                          POSIX_FADV_DONTNEED);
  }
  table_.publish(*slot, layer, expert, tick());
  std::lock_guard<std::mutex> l(mu_);
  stats_.loads += 1;
  stats_.bytes_read += sl.gate.bytes + sl.up.bytes + sl.down.bytes;
  return absl::OkStatus();
}

void Store::reader_loop() {
  for (;;) {
    std::shared_ptr<Load> job;
    {
      std::unique_lock<std::mutex> l(mu_);
      work_cv_.wait(l, [&] { return stop_ || !demand_.empty() || !prefetch_.empty(); });
      if (stop_) return;
      auto& q = !demand_.empty() ? demand_ : prefetch_;  // demand misses go first
      job = q.front();
      q.pop_front();
    }
    const Status s = table_.resident_slot(job->layer, job->expert) ? absl::OkStatus() : load_into(job->layer, job->expert);
    std::lock_guard<std::mutex> l(mu_);
    job->status = s;
    job->done = true;
    inflight_.erase(uint64_t{job->layer} * cfg_.n_expert + job->expert);
    job->cv.notify_all();
  }
}

StatusOr<Lease> Store::acquire(uint32_t layer, uint32_t expert) {
  RETURN_IF_ERROR(slices_.at(layer, expert).status());
  for (int attempt = 0; attempt < 8; ++attempt) {
    if (auto lease = table_.try_acquire(layer, expert, tick())) {
      std::lock_guard<std::mutex> l(mu_);
      ++(attempt == 0 ? stats_.hits : stats_.misses);
      return *lease;
    }
    std::unique_lock<std::mutex> l(mu_);
    const uint64_t key = uint64_t{layer} * cfg_.n_expert + expert;
    auto it = inflight_.find(key);
    std::shared_ptr<Load> job;
    if (it == inflight_.end()) {
      job = std::make_shared<Load>();
      job->layer = layer;
      job->expert = expert;
      inflight_[key] = job;
      demand_.push_back(job);
      work_cv_.notify_one();
    } else {
      job = it->second;
      // A queued prefetch of the same expert is promoted to demand.
      for (auto p = prefetch_.begin(); p != prefetch_.end(); ++p) {
        if (*p == job) {
          prefetch_.erase(p);
          demand_.push_front(job);
          break;
        }
      }
    }
    job->cv.wait(l, [&] { return job->done || stop_; });
    if (stop_) return absl::UnavailableError("the expert store is stopping");
    if (!job->status.ok()) return job->status;
  }
  return absl::UnavailableError(absl::StrCat("expert ", expert, " of layer ", layer, " kept being evicted before it could be leased"));
}

void Store::prefetch(uint32_t layer, uint32_t expert) {
  if (!slices_.at(layer, expert).ok() || table_.resident_slot(layer, expert)) return;
  std::lock_guard<std::mutex> l(mu_);
  const uint64_t key = uint64_t{layer} * cfg_.n_expert + expert;
  if (inflight_.count(key)) return;
  auto job = std::make_shared<Load>();
  job->layer = layer;
  job->expert = expert;
  inflight_[key] = job;
  prefetch_.push_back(job);
  ++stats_.prefetches;
  work_cv_.notify_one();
}

void Store::release(const Lease& lease) {
  table_.release(lease);
  slot_cv_.notify_all();
}

StoreStats Store::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  StoreStats s = stats_;
  s.evictions = s.loads > s.slots ? s.loads - s.slots : 0;
  s.leased = table_.leased_slots();
  for (uint32_t la = 0; la < cfg_.n_layer; ++la) {
    for (uint32_t e = 0; e < cfg_.n_expert; ++e) s.resident += table_.resident_slot(la, e) ? 1 : 0;
  }
  return s;
}

}  // namespace dsflash::expertstore
