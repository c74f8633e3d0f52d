// dsflash.v1.ExpertStore (see service.h).
#include "expertstore_svc/service.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <functional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace dsflash::expertstore {
namespace {

namespace pb = dsflash::v1;

grpc::Status to_grpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

std::string code_name(const grpc::Status& s) {
  static const char* kNames[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
                                 "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
                                 "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  const int c = static_cast<int>(s.error_code());
  return c >= 0 && c <= 16 ? kNames[c] : "UNKNOWN";
}

void fill(pb::SliceLayout* out, const Slice& s, uint64_t rows, uint64_t cols) {
  out->set_ggml_type(static_cast<uint32_t>(s.type));
  out->set_slot_offset(s.slot_offset);
  out->set_bytes(s.bytes);
  out->set_rows(rows);
  out->set_cols(cols);
  out->set_tiles(s.tiles);
}

// Blocking work (expert loads) runs here, off gRPC's callback threads.
class Workers {
 public:
  explicit Workers(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~Workers() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void run(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> l(mu_);
      q_.push_back(std::move(f));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || !q_.empty(); });
        if (q_.empty()) return;
        f = std::move(q_.front());
        q_.pop_front();
      }
      f();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

Workers& workers() {
  static Workers* w = new Workers(8);  // process lifetime: requests may outlive a service object
  return *w;
}

}  // namespace

// One session: the stream carries SessionInfo, then stays open until the client goes away
// or the store shuts down; OnDone drops the session's leases.
class ExpertStoreService::SessionReactor final : public grpc::ServerWriteReactor<pb::SessionEvent> {
 public:
  SessionReactor(ExpertStoreService* svc, uint64_t id, pb::SessionEvent first)
      : svc_(svc), id_(id), first_(std::move(first)) {
    writing_ = true;
    StartWrite(&first_);
  }
  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> l(mu_);
    writing_ = false;
    if (!ok && !final_) final_ = grpc::Status(grpc::StatusCode::CANCELLED, "session stream broken");
    if (final_ && !finished_) finish_locked();
  }
  void OnCancel() override { end(grpc::Status(grpc::StatusCode::CANCELLED, "client gone")); }
  void OnDone() override {
    svc_->end_session(id_);
    delete this;
  }
  void end(grpc::Status s) {
    std::lock_guard<std::mutex> l(mu_);
    if (!final_) final_ = std::move(s);
    if (!writing_ && !finished_) finish_locked();
  }

 private:
  void finish_locked() {
    finished_ = true;
    Finish(*final_);
  }
  ExpertStoreService* svc_;
  uint64_t id_;
  pb::SessionEvent first_;
  std::mutex mu_;
  bool writing_ = false, finished_ = false;
  std::optional<grpc::Status> final_;
};

StatusOr<std::unique_ptr<ExpertStoreService>> ExpertStoreService::create(Store& store, StoreMetrics* metrics,
                                                                         const std::string& fd_socket) {
  std::unique_ptr<ExpertStoreService> s(new ExpertStoreService(store, metrics));
  s->fd_socket_ = fd_socket;
  ASSIGN_OR_RETURN(s->fingerprint_, store.model().fingerprint("_exps."));
  // Clients get the host arena read-only; a VMM arena fd as exported (the importer sets its
  // own access); a legacy IPC arena travels as a handle in SessionInfo instead.
  if (store.arena().mechanism() == "memfd") {
    ASSIGN_OR_RETURN(s->ro_arena_fd_, ipc::reopen_read_only(store.arena().fd()));
  } else if (store.arena().fd() >= 0) {
    s->ro_arena_fd_ = ::dup(store.arena().fd());
  }
  ASSIGN_OR_RETURN(s->ro_table_fd_, ipc::reopen_read_only(store.table_region().fd()));
  ASSIGN_OR_RETURN(s->listen_fd_, ipc::listen_unix(fd_socket));
  s->fd_thread_ = std::thread([p = s.get()] { p->fd_loop(); });
  return s;
}

ExpertStoreService::~ExpertStoreService() {
  stopping_ = true;
  if (fd_thread_.joinable()) fd_thread_.join();
  for (int fd : {listen_fd_, ro_arena_fd_, ro_table_fd_}) {
    if (fd >= 0) ::close(fd);
  }
  ::unlink(fd_socket_.c_str());
}

void ExpertStoreService::shutdown() {
  stopping_ = true;
  std::lock_guard<std::mutex> l(mu_);
  for (auto& [id, r] : sessions_) r->end(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the expert store is shutting down"));
}

size_t ExpertStoreService::sessions() const {
  std::lock_guard<std::mutex> l(mu_);
  return sessions_.size();
}

pb::SessionInfo ExpertStoreService::describe() const {
  const config::ModelConfig& c = store_.config();
  const SliceMap& m = store_.slices();
  pb::SessionInfo info;
  info.set_model_name(c.name);
  info.set_model_fingerprint(fingerprint_);
  info.set_n_layers(c.n_layer);
  info.set_n_experts(c.n_expert);
  info.set_n_expert_used(c.n_expert_used);
  info.set_n_slots(store_.table().header().n_slots);
  info.set_slot_bytes(m.slot_bytes());
  info.set_arena_bytes(store_.arena().bytes());
  info.set_arena_mechanism(store_.arena().mechanism());
  info.set_cuda_ipc_handle(store_.arena().ipc_handle());
  info.set_table_bytes(store_.table_region().size());
  info.set_lease_bytes(store_.lease_region().size());
  info.set_fd_socket(fd_socket_);
  for (uint32_t l = 0; l < c.n_layer; ++l) {
    const ExpertSlices s = *m.at(l, 0);
    pb::LayerLayout* out = info.add_layers();
    fill(out->mutable_gate(), s.gate, c.expert_ffn, c.n_embd);
    fill(out->mutable_up(), s.up, c.expert_ffn, c.n_embd);
    fill(out->mutable_down(), s.down, c.n_embd, c.expert_ffn);
  }
  return info;
}

grpc::ServerWriteReactor<pb::SessionEvent>* ExpertStoreService::OpenSession(grpc::CallbackServerContext*,
                                                                           const pb::OpenSessionRequest* req) {
  auto refuse = [](grpc::Status s) {
    struct Refusal : grpc::ServerWriteReactor<pb::SessionEvent> {
      explicit Refusal(grpc::Status s) { Finish(s); }
      void OnDone() override { delete this; }
    };
    return new Refusal(std::move(s));
  };
  if (stopping_) return refuse(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the expert store is shutting down"));
  if (!req->model_fingerprint().empty() && req->model_fingerprint() != fingerprint_) {
    return refuse(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                               absl::StrCat("the expert store serves ", store_.model().path(), " (expert fingerprint ",
                                            fingerprint_, "), not the client's model (", req->model_fingerprint(), ")")));
  }
  auto row = store_.open_session();
  if (!row.ok()) return refuse(to_grpc(row.status()));
  pb::SessionEvent first;
  *first.mutable_info() = describe();
  first.mutable_info()->set_lease_row(row->row);
  std::lock_guard<std::mutex> l(mu_);
  uint64_t id = 0;
  while (id == 0 || sessions_.count(id)) id = rng_();
  first.mutable_info()->set_session_id(id);
  rows_[id] = *row;
  auto* r = new SessionReactor(this, id, std::move(first));
  sessions_[id] = r;
  log::info("expert store: session %u opened by '%s'", row->row, req->client_name().c_str());
  return r;
}

void ExpertStoreService::end_session(uint64_t id) {
  SessionRow row;
  {
    std::lock_guard<std::mutex> l(mu_);
    sessions_.erase(id);
    auto it = rows_.find(id);
    if (it == rows_.end()) return;
    row = it->second;
    rows_.erase(it);
  }
  const uint64_t dropped = store_.close_session(row);
  log::info("expert store: session %u closed (%llu leases dropped)", row.row, static_cast<unsigned long long>(dropped));
}

StatusOr<SessionRow> ExpertStoreService::lease_row(uint64_t session_id) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = rows_.find(session_id);
  if (it == rows_.end()) return absl::NotFoundError(absl::StrCat("no open session ", session_id));
  return it->second;
}

grpc::ServerUnaryReactor* ExpertStoreService::Acquire(grpc::CallbackServerContext* ctx, const pb::AcquireRequest* req,
                                                      pb::AcquireResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  workers().run([this, req, resp, reactor] {
    const grpc::Status st = [&]() -> grpc::Status {
      auto row = lease_row(req->session_id());
      if (!row.ok()) return to_grpc(row.status());
      if (req->experts_size() > 4096) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "experts: more than 4096");
      for (const auto& e : req->experts()) {
        if (!store_.slices().at(e.layer(), e.expert()).ok()) {
          return grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                              absl::StrCat("experts: layer ", e.layer(), " expert ", e.expert(), " does not exist (",
                                           store_.slices().n_layers(), " layers x ", store_.slices().n_experts(), ")"));
        }
        store_.prefetch(e.layer(), e.expert(), /*demand=*/true);  // all loads in flight at once
      }
      std::vector<Lease> held;
      for (const auto& e : req->experts()) {
        auto lease = store_.acquire(*row, e.layer(), e.expert());
        if (!lease.ok()) {
          for (const Lease& h : held) (void)store_.release(h);
          return to_grpc(lease.status());
        }
        held.push_back(*lease);
        pb::Grant* g = resp->add_grants();
        g->set_slot(lease->slot);
        g->set_generation(lease->generation);
      }
      return grpc::Status::OK;
    }();
    if (metrics_) metrics_->on_acquire(code_name(st));
    reactor->Finish(st);
  });
  return reactor;
}

grpc::ServerUnaryReactor* ExpertStoreService::Prefetch(grpc::CallbackServerContext* ctx, const pb::PrefetchRequest* req,
                                                       pb::PrefetchResponse* resp) {
  uint32_t queued = 0;
  for (const auto& e : req->experts()) queued += store_.prefetch(e.layer(), e.expert()) ? 1 : 0;
  resp->set_queued(queued);
  auto* r = ctx->DefaultReactor();
  r->Finish(grpc::Status::OK);
  return r;
}

grpc::ServerUnaryReactor* ExpertStoreService::Release(grpc::CallbackServerContext* ctx, const pb::ReleaseRequest* req,
                                                      pb::ReleaseResponse*) {
  auto* r = ctx->DefaultReactor();
  auto row = lease_row(req->session_id());
  if (!row.ok()) {
    r->Finish(to_grpc(row.status()));
    return r;
  }
  for (const auto& g : req->leases()) {
    const Status s = store_.release(*row, g.slot(), g.generation());
    if (!s.ok()) {
      r->Finish(to_grpc(s));
      return r;
    }
  }
  r->Finish(grpc::Status::OK);
  return r;
}

grpc::ServerUnaryReactor* ExpertStoreService::GetStats(grpc::CallbackServerContext* ctx, const pb::GetStatsRequest*,
                                                       pb::StoreStats* out) {
  const StoreStats s = store_.stats();
  out->set_hits(s.hits);
  out->set_misses(s.misses);
  out->set_evictions(s.evictions);
  out->set_loads(s.loads);
  out->set_load_failures(s.load_failures);
  out->set_bytes_read(s.bytes_read);
  out->set_prefetches(s.prefetches);
  out->set_host_tier_hits(s.host_tier_hits);
  out->set_host_tier_slots(s.host_tier_slots);
  out->set_slots(s.slots);
  out->set_resident(s.resident);
  out->set_leased(s.leased);
  out->set_sessions(s.sessions);
  out->set_slot_bytes(store_.slices().slot_bytes());
  out->set_arena_mechanism(store_.arena().mechanism());
  out->set_direct_io(store_.direct_io());
  auto* r = ctx->DefaultReactor();
  r->Finish(grpc::Status::OK);
  return r;
}

// The fd hand-over: a client connects, sends its session id, and receives [arena, slot table
// (read-only), lease table] (no arena fd for a legacy CUDA IPC arena) — or no fds and an
// error line.
void ExpertStoreService::fd_loop() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    const int conn = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    serve_fds(conn);
    ::close(conn);
  }
}

void ExpertStoreService::serve_fds(int conn) {
  timeval tv{2, 0};
  ::setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::vector<int> none;
  std::string payload;
  if (!ipc::recv_fds(conn, 0, &none, &payload).ok()) return;
  uint64_t id = 0;
  if (!absl::SimpleAtoi(payload, &id) || !lease_row(id).ok()) {
    (void)ipc::send_fds(conn, {}, "error: unknown session");
    return;
  }
  std::vector<int> fds = {ro_table_fd_, store_.lease_region().fd()};
  if (ro_arena_fd_ >= 0) fds.insert(fds.begin(), ro_arena_fd_);
  (void)ipc::send_fds(conn, fds, "ok");
}

}  // namespace dsflash::expertstore
