// Expert store core (see store.h).
#include "expertstore_svc/store.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "kernels/exec.h"

namespace dsflash::expertstore {
namespace {

using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

StatusOr<std::unique_ptr<Store>> Store::open(const std::string& model_path, StoreOptions o) {
  if (!(o.evict_oldest_fraction >= 0 && o.evict_oldest_fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("eviction: the oldest fraction must be in [0, 1], not ", o.evict_oldest_fraction));
  }
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
  std::string kind = o.arena;
  if (kind == "auto") kind = kernels::cuda_available() ? "device" : "host";
  if (kind == "host") {
    ASSIGN_OR_RETURN(s->arena_, HostArena::create(slot * slots));
  } else if (kind == "device") {
    std::string report;
    ASSIGN_OR_RETURN(s->arena_, create_device_arena(slot * slots, o.device, o.device_mechanism, &report));
    log::info("expert store: %s", report.c_str());
    if (o.tiles) s->slices_.use_tiles();
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown arena kind '", o.arena, "' (host, device or auto)"));
  }
  ASSIGN_OR_RETURN(s->table_mem_, ipc::SharedRegion::create("dsflash-slot-table",
                                                            SlotTable::table_bytes(s->cfg_.n_layer, s->cfg_.n_expert, slots)));
  ASSIGN_OR_RETURN(s->lease_mem_, ipc::SharedRegion::create("dsflash-leases", SlotTable::lease_bytes(s->cfg_.n_layer, s->cfg_.n_expert, slots)));
  s->table_ = SlotTable::create(s->table_mem_.data(), s->lease_mem_.data(), s->cfg_.n_layer, s->cfg_.n_expert, slots, slot);
  s->table_.set_eviction(o.evict_oldest_fraction);
  if (o.evict_least_frequent) s->table_.set_least_frequent(16ull * s->cfg_.n_layer * s->cfg_.n_expert);
  uint64_t max_slice = 0;
  for (uint32_t l = 0; l < s->cfg_.n_layer; ++l) {
    ASSIGN_OR_RETURN(const ExpertSlices sl, s->slices_.at(l, 0));
    max_slice = std::max({max_slice, sl.gate.bytes, sl.up.bytes, sl.down.bytes});
  }
  const int readers = std::max(1, o.reader_threads);
  const size_t n_buf = o.staging_buffers > 0 ? static_cast<size_t>(o.staging_buffers) : 2 * static_cast<size_t>(readers);
  ASSIGN_OR_RETURN(s->ring_, StagingRing::create(n_buf, SliceReader::staging_bytes(max_slice),
                                                  o.pin_staging ? s->arena_.get() : nullptr));
  ASSIGN_OR_RETURN(s->reader_, SliceReader::open(*s->model_, o.direct_io));
  if (o.host_cache_bytes > 0) {
    ASSIGN_OR_RETURN(s->tier_, HostTier::create(o.host_cache_bytes, slot, o.pin_staging ? s->arena_.get() : nullptr));
    s->stats_.host_tier_slots = s->tier_->entries();
    log::info("expert store: host cache of %u experts (%.1f MiB)%s", s->tier_->entries(),
              s->tier_->entries() * (slot / 1048576.0), o.pin_staging ? ", page-locked" : "");
  }
  for (uint32_t i = 1; i < kSessions; ++i) s->free_sessions_.push_back(i);
  s->open_[kLocalSession] = true;
  s->stats_.slots = slots;
  for (int i = 0; i < readers; ++i) s->readers_.emplace_back([p = s.get()] { p->reader_loop(); });
  const std::string eviction = o.evict_least_frequent        ? "least-frequent (aged)"
                               : o.evict_oldest_fraction > 0 ? absl::StrCat("random among the oldest ", o.evict_oldest_fraction)
                                                             : "least-recent";
  log::info("expert store: %u slots of %.2f MiB (%.1f MiB %s arena) for %u layers x %u experts; staging %zu x %.2f MiB%s; "
            "%d %s readers; eviction %s",
            slots, slot / 1048576.0, slot * slots / 1048576.0, s->arena_->mechanism().c_str(), s->cfg_.n_layer,
            s->cfg_.n_expert, n_buf, s->ring_->buffer_bytes() / 1048576.0, o.pin_staging ? " page-locked" : "", readers,
            s->reader_->direct() ? "O_DIRECT" : "buffered", eviction);
  return s;
}

void Store::stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    for (auto& [key, job] : inflight_) job->cv.notify_all();
  }
  work_cv_.notify_all();
  for (auto& t : readers_) {
    if (t.joinable()) t.join();
  }
}

Store::~Store() { stop(); }

StatusOr<SessionRow> Store::open_session() {
  std::lock_guard<std::mutex> l(mu_);
  if (free_sessions_.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat("the expert store serves at most ", kSessions - 1, " client sessions"));
  }
  const uint32_t s = free_sessions_.front();
  free_sessions_.pop_front();
  open_[s] = true;
  epoch_[s] = ++opened_;
  ++stats_.sessions;
  return SessionRow{s, epoch_[s]};
}

bool Store::is_open(SessionRow s) const { return s.row < kSessions && open_[s.row] && epoch_[s.row] == s.epoch; }

uint64_t Store::close_session(SessionRow session) {
  if (session.row == kLocalSession) return 0;
  std::lock_guard<std::mutex> l(mu_);
  if (!is_open(session)) return 0;
  const uint32_t row = session.row;
  retired_hits_ += table_.session_hits(row);
  const uint64_t dropped = table_.clear_session(row);
  open_[row] = false;
  free_sessions_.push_back(row);
  --stats_.sessions;
  return dropped;
}

// A slot to refill: waits (polling, as clients release leases in shared memory without
// telling the store) while every slot is leased.
StatusOr<uint32_t> Store::wait_for_victim(bool* evicted) {
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  for (;;) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return absl::UnavailableError("the expert store is stopping");
      if (auto slot = table_.lock_victim(evicted)) return *slot;
    }
    if (Clock::now() > deadline) return absl::ResourceExhaustedError("every expert slot stayed leased for 30 s");
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

// Fills a victim slot with the job's expert, from the host tier when it holds it, else from
// disk through the staging ring (filling a host tier entry on the way), and publishes it.
Status Store::load_into(Load& job, LoadEvent& ev) {
  ASSIGN_OR_RETURN(const ExpertSlices sl, slices_.at(job.layer, job.expert));
  ASSIGN_OR_RETURN(const uint32_t slot, wait_for_victim(&ev.evicted));
  const uint64_t base = uint64_t{slot} * slices_.slot_bytes();
  const HostTier::Handle cached = tier_ ? tier_->find(job.layer, job.expert) : HostTier::Handle{};
  Status st = cached ? copy_from_tier(sl, cached, base, ev) : read_from_disk(job, sl, base, ev);
  if (tier_) tier_->release(cached);
  if (!st.ok()) {
    table_.abandon(slot);
    return absl::Status(st.code(), absl::StrCat("loading expert ", job.expert, " of layer ", job.layer, ": ", st.message()));
  }
  table_.publish(slot, job.layer, job.expert, tick());
  return absl::OkStatus();
}

Status Store::copy_from_tier(const ExpertSlices& sl, const HostTier::Handle& cached, uint64_t base, LoadEvent& ev) {
  ev.host_tier = true;
  for (const Slice* s : {&sl.gate, &sl.up, &sl.down}) {
    const auto t0 = Clock::now();
    RETURN_IF_ERROR(copy_slice(base, *s, cached.data + s->slot_offset));
    ev.copy_s += seconds(t0, Clock::now());
  }
  return absl::OkStatus();
}

Status Store::read_from_disk(const Load& job, const ExpertSlices& sl, uint64_t base, LoadEvent& ev) {
  const HostTier::Handle fill = tier_ ? tier_->take_for(job.layer, job.expert) : HostTier::Handle{};
  uint8_t* buf = ring_->take();
  Status st;
  for (const Slice* s : {&sl.gate, &sl.up, &sl.down}) {
    const auto t0 = Clock::now();
    const uint8_t* data = nullptr;
    st = reader_->read(s->shard, s->file_offset, s->bytes, buf, ring_->buffer_bytes(), &data);
    const auto t1 = Clock::now();
    if (st.ok()) st = copy_slice(base, *s, data);
    if (st.ok() && fill) std::memcpy(fill.data + s->slot_offset, data, s->bytes);
    ev.read_s += seconds(t0, t1);
    ev.copy_s += seconds(t1, Clock::now());
    if (!st.ok()) break;
    ev.bytes += s->bytes;
  }
  ring_->give(buf);
  if (tier_) tier_->release(fill, st.ok());
  return st;
}

Status Store::copy_slice(uint64_t base, const Slice& s, const uint8_t* data) {
  if (!s.tiles) return arena_->copy_in(base + s.slot_offset, data, s.bytes);
  return arena_->copy_in_tiles(base + s.slot_offset, kernels::Weight{s.type, s.cols, s.rows, data, s.bytes / s.rows});
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
    LoadEvent ev;
    ev.layer = job->layer;
    ev.expert = job->expert;
    ev.demand = job->demand;
    ev.queue_s = seconds(job->queued, Clock::now());
    const bool resident = table_.resident_slot(job->layer, job->expert) != 0;
    const Status s = resident ? absl::OkStatus() : load_into(*job, ev);
    ev.ok = s.ok();
    ev.code = s.code();
    ev.total_s = seconds(job->queued, Clock::now());
    {
      std::lock_guard<std::mutex> l(mu_);
      job->status = s;
      job->done = true;
      inflight_.erase(uint64_t{job->layer} * cfg_.n_expert + job->expert);
      if (!resident) {
        ++(s.ok() ? stats_.loads : stats_.load_failures);
        stats_.host_tier_hits += s.ok() && ev.host_tier ? 1 : 0;
        stats_.bytes_read += ev.bytes;
        stats_.evictions += ev.evicted ? 1 : 0;
      }
      job->cv.notify_all();
    }
    if (!resident) {
      std::shared_ptr<const std::function<void(const LoadEvent&)>> observer;
      {
        std::lock_guard<std::mutex> l(observer_mu_);
        observer = on_load_;
      }
      if (observer && *observer) (*observer)(ev);
    }
    if (!s.ok()) log::warn("expert store: %s", std::string(s.message()).c_str());
  }
}

StatusOr<Lease> Store::acquire(SessionRow session, uint32_t layer, uint32_t expert) {
  if (session.row >= kSessions) return absl::InvalidArgumentError(absl::StrCat("no session row ", session.row));
  RETURN_IF_ERROR(slices_.at(layer, expert).status());
  for (int attempt = 0; attempt < 8; ++attempt) {
    {
      // Under mu_, as close_session: a session that closed while this call waited for a load
      // (its client died) gets no lease, which nothing would drop, nor its row's next session;
      // one taken before the close is dropped by it.
      std::lock_guard<std::mutex> l(mu_);
      if (!is_open(session)) return absl::UnavailableError(absl::StrCat("session row ", session.row, " is closed"));
      if (auto lease = table_.try_acquire(session.row, layer, expert, tick())) {
        ++(attempt == 0 ? stats_.hits : stats_.misses);
        return *lease;
      }
    }
    std::unique_lock<std::mutex> l(mu_);
    if (stop_) return absl::UnavailableError("the expert store is stopping");
    const uint64_t key = uint64_t{layer} * cfg_.n_expert + expert;
    auto it = inflight_.find(key);
    std::shared_ptr<Load> job;
    if (it == inflight_.end()) {
      job = std::make_shared<Load>();
      job->layer = layer;
      job->expert = expert;
      job->queued = Clock::now();
      inflight_[key] = job;
      demand_.push_back(job);
      work_cv_.notify_one();
    } else {
      job = it->second;
      // A queued prefetch of the same expert is promoted to demand.
      auto p = std::find(prefetch_.begin(), prefetch_.end(), job);
      if (p != prefetch_.end()) {
        prefetch_.erase(p);
        job->demand = true;
        demand_.push_front(job);
      }
    }
    job->cv.wait(l, [&] { return job->done || stop_; });
    if (stop_) return absl::UnavailableError("the expert store is stopping");
    if (!job->status.ok()) return job->status;
  }
  return absl::UnavailableError(absl::StrCat("expert ", expert, " of layer ", layer, " kept being evicted before it could be leased"));
}

bool Store::prefetch(uint32_t layer, uint32_t expert, bool demand) {
  if (!slices_.at(layer, expert).ok() || table_.resident_slot(layer, expert)) return false;
  std::lock_guard<std::mutex> l(mu_);
  const uint64_t key = uint64_t{layer} * cfg_.n_expert + expert;
  if (stop_) return false;
  if (auto it = inflight_.find(key); it != inflight_.end()) {
    auto p = std::find(prefetch_.begin(), prefetch_.end(), it->second);
    if (!demand || p == prefetch_.end()) return false;
    prefetch_.erase(p);
    it->second->demand = true;
    demand_.push_back(it->second);
    return true;
  }
  auto job = std::make_shared<Load>();
  job->layer = layer;
  job->expert = expert;
  job->demand = demand;
  job->queued = Clock::now();
  inflight_[key] = job;
  (demand ? demand_ : prefetch_).push_back(job);
  stats_.prefetches += demand ? 0 : 1;
  work_cv_.notify_one();
  return true;
}

Status Store::release(const Lease& lease) {
  if (lease.session >= kSessions || lease.slot >= stats_.slots) {
    return absl::InvalidArgumentError(absl::StrCat("no lease on slot ", lease.slot, " for session ", lease.session));
  }
  if (table_.lease_count(lease.session, lease.slot) == 0) {
    return absl::FailedPreconditionError(absl::StrCat("session ", lease.session, " holds no lease on slot ", lease.slot));
  }
  table_.release(lease);
  return absl::OkStatus();
}

Status Store::release(SessionRow session, uint32_t slot, uint64_t generation) {
  std::lock_guard<std::mutex> l(mu_);  // as close_session
  if (!is_open(session)) return absl::UnavailableError(absl::StrCat("session row ", session.row, " is closed"));
  return release(Lease{session.row, slot, generation});
}

StoreStats Store::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  StoreStats s = stats_;
  s.hits += retired_hits_;
  for (uint32_t i = 0; i < kSessions; ++i) s.hits += table_.session_hits(i);
  s.leased = table_.leased_slots();
  for (uint32_t la = 0; la < cfg_.n_layer; ++la) {
    for (uint32_t e = 0; e < cfg_.n_expert; ++e) s.resident += table_.resident_slot(la, e) ? 1 : 0;
  }
  s.queued_demand = demand_.size();
  s.queued_prefetch = prefetch_.size();
  s.ring_in_use = ring_->in_use();
  s.ring_size = ring_->size();
  return s;
}

}  // namespace dsflash::expertstore
