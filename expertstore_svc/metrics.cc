// Prometheus metrics of the expert store (dsflash_expertstore_*).
#include "expertstore_svc/service.h"

namespace dsflash::expertstore {
namespace {

prometheus::Histogram::BucketBoundaries exp_buckets(double first, double factor, int n) {
  prometheus::Histogram::BucketBoundaries b;
  for (double v = first; n-- > 0; v *= factor) b.push_back(v);
  return b;
}

prometheus::Counter* counter(prometheus::Registry& r, const std::string& name, const std::string& help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

prometheus::Gauge* gauge(prometheus::Registry& r, const std::string& name, const std::string& help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}

}  // namespace

StoreMetrics::StoreMetrics(const Store& store) : store_(store), registry_(std::make_shared<prometheus::Registry>()) {
  auto& r = *registry_;
  const std::string p = "dsflash_expertstore_";
  hits_ = counter(r, p + "hits_total", "Expert acquisitions served from a resident slot (client hits included)");
  misses_ = counter(r, p + "misses_total", "Expert acquisitions that waited for a load");
  evictions_ = counter(r, p + "evictions_total", "Resident experts evicted to make room");
  bytes_read_ = counter(r, p + "bytes_read_total", "Expert bytes read from the shards");
  prefetches_ = counter(r, p + "prefetches_total", "Prefetch loads queued");
  host_tier_hits_ = counter(r, p + "host_cache_hits_total", "Expert loads served from the host-memory tier (no disk read)");
  loads_ = &prometheus::BuildCounter().Name(p + "loads_total").Help("Expert loads by result").Register(r);
  rejected_ = &prometheus::BuildCounter()
                   .Name(p + "files_rejected_total")
                   .Help("Shard reads refused at run time, by reason")
                   .Register(r);
  for (const char* result : {"ok", "failed"}) loads_->Add({{"result", result}});
  for (const char* reason : {"truncated_or_corrupt", "io_error"}) rejected_->Add({{"reason", reason}});
  acquires_ = &prometheus::BuildCounter().Name(p + "acquire_requests_total").Help("Acquire RPCs by gRPC status").Register(r);
  auto& stage = prometheus::BuildHistogram()
                    .Name(p + "load_stage_seconds")
                    .Help("Time per expert load spent in each stage (queue, read, copy)")
                    .Register(r);
  queue_s_ = &stage.Add({{"stage", "queue"}}, exp_buckets(1e-5, 2, 20));
  read_s_ = &stage.Add({{"stage", "read"}}, exp_buckets(1e-5, 2, 20));
  copy_s_ = &stage.Add({{"stage", "copy"}}, exp_buckets(1e-6, 2, 20));
  auto& load = prometheus::BuildHistogram()
                   .Name(p + "load_seconds")
                   .Help("Expert load latency from request to ready, by priority")
                   .Register(r);
  demand_load_s_ = &load.Add({{"priority", "demand"}}, exp_buckets(1e-5, 2, 22));
  prefetch_load_s_ = &load.Add({{"priority", "prefetch"}}, exp_buckets(1e-5, 2, 22));
  resident_slots_ = gauge(r, p + "resident_slots", "Slots holding a ready expert");
  resident_bytes_ = gauge(r, p + "resident_bytes", "Bytes of the arena holding ready experts");
  capacity_slots_ = gauge(r, p + "capacity_slots", "Slots in the arena");
  capacity_bytes_ = gauge(r, p + "capacity_bytes", "Bytes of the arena");
  leased_ = gauge(r, p + "leased_slots", "Slots leased by at least one session");
  sessions_ = gauge(r, p + "sessions", "Open client sessions");
  ring_in_use_ = gauge(r, p + "staging_ring_in_use", "Staging buffers being filled or copied");
  ring_size_ = gauge(r, p + "staging_ring_buffers", "Staging buffers in the ring");
  queued_demand_ = gauge(r, p + "queued_demand_loads", "Demand loads waiting for a reader");
  queued_prefetch_ = gauge(r, p + "queued_prefetch_loads", "Prefetch loads waiting for a reader");
  prometheus::BuildGauge()
      .Name(p + "build_info")
      .Help("Build and configuration information")
      .Register(r)
      .Add({{"version", "0.1.0"}, {"model", store.config().name}, {"arena", store.arena().mechanism()},
            {"io", store.direct_io() ? "direct" : "buffered"}})
      .Set(1);
  refresh();
}

void StoreMetrics::on_load(const LoadEvent& ev) {
  loads_->Add({{"result", ev.ok ? "ok" : "failed"}}).Increment();
  if (!ev.ok) {
    rejected_->Add({{"reason", ev.code == absl::StatusCode::kDataLoss ? "truncated_or_corrupt" : "io_error"}}).Increment();
    return;
  }
  queue_s_->Observe(ev.queue_s);
  read_s_->Observe(ev.read_s);
  copy_s_->Observe(ev.copy_s);
  (ev.demand ? demand_load_s_ : prefetch_load_s_)->Observe(ev.total_s);
}

void StoreMetrics::on_acquire(const std::string& code) { acquires_->Add({{"code", code}}).Increment(); }

void StoreMetrics::refresh() {
  const StoreStats s = store_.stats();
  std::lock_guard<std::mutex> l(mu_);
  hits_->Increment(static_cast<double>(s.hits - std::min(s.hits, last_.hits)));
  misses_->Increment(static_cast<double>(s.misses - last_.misses));
  evictions_->Increment(static_cast<double>(s.evictions - last_.evictions));
  bytes_read_->Increment(static_cast<double>(s.bytes_read - last_.bytes_read));
  prefetches_->Increment(static_cast<double>(s.prefetches - last_.prefetches));
  host_tier_hits_->Increment(static_cast<double>(s.host_tier_hits - last_.host_tier_hits));
  last_ = s;
  const double slot = static_cast<double>(store_.slices().slot_bytes());
  resident_slots_->Set(s.resident);
  resident_bytes_->Set(s.resident * slot);
  capacity_slots_->Set(s.slots);
  capacity_bytes_->Set(s.slots * slot);
  leased_->Set(s.leased);
  sessions_->Set(s.sessions);
  ring_in_use_->Set(static_cast<double>(s.ring_in_use));
  ring_size_->Set(static_cast<double>(s.ring_size));
  queued_demand_->Set(static_cast<double>(s.queued_demand));
  queued_prefetch_->Set(static_cast<double>(s.queued_prefetch));
}

}  // namespace dsflash::expertstore
