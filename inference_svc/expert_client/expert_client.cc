// ExpertClient (see expert_client.h).
#include "inference_svc/expert_client/expert_client.h"

#include <grpcpp/grpcpp.h>

#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/ipc/shm.h"
#include "common/log.h"
#include "common/quant/quant.h"
#include "dsflash/v1/expertstore.grpc.pb.h"
#include "expertstore_svc/arena.h"
#include "expertstore_svc/slot_table.h"
#include "kernels/linear/linear_cuda.h"

namespace dsflash::expertclient {
namespace {

namespace pb = dsflash::v1;
using Clock = std::chrono::steady_clock;

Status from_grpc(const grpc::Status& s, const std::string& what) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), absl::StrCat(what, ": ", s.error_message()));
}

// Checks that a layer's slices have the shapes this model computes with.
Status check_slice(const pb::SliceLayout& s, uint64_t rows, uint64_t cols, uint64_t slot_bytes, const std::string& what) {
  const auto rb = quant::row_bytes(static_cast<quant::GgmlType>(s.ggml_type()), cols);
  if (s.rows() != rows || s.cols() != cols || !rb.ok() || *rb * rows != s.bytes() || s.slot_offset() + s.bytes() > slot_bytes) {
    return absl::FailedPreconditionError(absl::StrCat("the expert store's ", what, " is ", s.rows(), "x", s.cols(),
                                                      " (type ", s.ggml_type(), ", ", s.bytes(), " bytes at ",
                                                      s.slot_offset(), "); this model needs ", rows, "x", cols));
  }
  // Tiles (kernels/linear/tiles.h): only where this process's kernels read them.
  const kernels::Weight shape{static_cast<quant::GgmlType>(s.ggml_type()), static_cast<int64_t>(cols),
                              static_cast<int64_t>(rows), nullptr, *rb};
  if (s.tiles() && !kernels::tiles_apply(shape)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the expert store keeps its ", what, " in the GPU tile order, which this process does not read (a ",
        quant::traits(shape.type).name, " ", rows, "x", cols, " matrix, or tiles turned off by DSF_WEIGHT_TILES=0, "
        "DSF_GEMV_MMA or DSF_GEMM_MMA); start the store with --expert-tiles false"));
  }
  return absl::OkStatus();
}

}  // namespace

struct ExpertClient::Session {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::ExpertStore::Stub> stub;
  grpc::ClientContext stream_ctx;
  std::unique_ptr<grpc::ClientReader<pb::SessionEvent>> reader;
  pb::SessionInfo info;
  ipc::SharedRegion arena, table_mem, lease_mem;
  std::unique_ptr<expertstore::DeviceArenaMapping> device_arena;  // a device arena, imported
  expertstore::SlotTable table;
  std::atomic<bool> alive{true};
};

struct ExpertClient::Held {
  std::shared_ptr<Session> session;
  expertstore::Lease lease;
};

ExpertClient::ExpertClient(ClientOptions options, const config::ModelConfig& cfg)
    : options_(std::move(options)), cfg_(cfg), thread_([this] { run(); }) {}

ExpertClient::~ExpertClient() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    if (session_) session_->stream_ctx.TryCancel();
    if (connecting_) connecting_->TryCancel();
  }
  cv_.notify_all();
  thread_.join();
}

bool ExpertClient::connected() const { return current() != nullptr; }

std::shared_ptr<ExpertClient::Session> ExpertClient::current() const {
  std::lock_guard<std::mutex> l(mu_);
  return session_ && session_->alive ? session_ : nullptr;
}

Status ExpertClient::availability() const {
  std::lock_guard<std::mutex> l(mu_);
  if (session_ && session_->alive) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("the expert store at ", options_.address, " is unavailable: ", last_error_));
}

Status ExpertClient::wait_connected(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, timeout, [&] { return stop_ || (session_ && session_->alive); });
  l.unlock();
  return availability();
}

void ExpertClient::run() {
  while (!stop_) {
    auto s = open_session();
    if (!s.ok()) {
      std::unique_lock<std::mutex> l(mu_);
      if (last_error_ != s.status().message()) log::warn("expert store: %s", std::string(s.status().message()).c_str());
      last_error_ = std::string(s.status().message());
      cv_.wait_for(l, options_.reconnect_interval, [&] { return stop_.load(); });
      continue;
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      session_ = *s;
      last_error_.clear();
    }
    cv_.notify_all();
    log::info("expert store: session %u with %s (%u slots of %.2f MiB, %s arena)", (*s)->info.lease_row(),
              options_.address.c_str(), (*s)->info.n_slots(), (*s)->info.slot_bytes() / 1048576.0,
              (*s)->info.arena_mechanism().c_str());
    pb::SessionEvent ev;
    while ((*s)->reader->Read(&ev)) {
    }
    const grpc::Status st = (*s)->reader->Finish();
    (*s)->alive = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      session_.reset();
      last_error_ = absl::StrCat("session lost (", st.error_message(), ")");
    }
    if (!stop_) log::warn("expert store at %s: session lost (%s); reconnecting", options_.address, st.error_message());
  }
}

StatusOr<std::shared_ptr<ExpertClient::Session>> ExpertClient::open_session() {
  auto s = std::make_shared<Session>();
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  s->channel = grpc::CreateCustomChannel(options_.address, grpc::InsecureChannelCredentials(), args);
  s->stub = pb::ExpertStore::NewStub(s->channel);
  pb::OpenSessionRequest req;
  req.set_client_name(options_.client_name);
  req.set_model_fingerprint(options_.model_fingerprint);
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) return absl::CancelledError("stopping");
    connecting_ = &s->stream_ctx;
  }
  s->reader = s->stub->OpenSession(&s->stream_ctx, req);
  pb::SessionEvent first;
  const bool got = s->reader->Read(&first);
  {
    std::lock_guard<std::mutex> l(mu_);
    connecting_ = nullptr;
  }
  if (!got || !first.has_info()) {
    const grpc::Status st = got ? grpc::Status(grpc::StatusCode::INTERNAL, "no session info") : s->reader->Finish();
    return from_grpc(st, "opening a session");
  }
  s->info = first.info();
  RETURN_IF_ERROR(check_session(s->info));
  // The fds: [arena, slot table (read-only), lease table]; no arena fd for a CUDA IPC handle.
  const size_t n_fds = s->info.arena_mechanism() == "cuda-ipc" ? 2 : 3;
  ASSIGN_OR_RETURN(std::vector<int> fds, receive_fds(s->info, n_fds));
  RETURN_IF_ERROR(map_session(*s, fds));
  return s;
}

Status ExpertClient::check_session(const pb::SessionInfo& in) const {
  if (in.n_layers() != cfg_.n_layer || in.n_experts() != cfg_.n_expert || in.layers_size() != static_cast<int>(cfg_.n_layer)) {
    return absl::FailedPreconditionError(absl::StrCat("the expert store serves ", in.n_layers(), " layers x ", in.n_experts(),
                                                      " experts; this model has ", cfg_.n_layer, " x ", cfg_.n_expert));
  }
  for (uint32_t l = 0; l < cfg_.n_layer; ++l) {
    const auto& L = in.layers(static_cast<int>(l));
    const std::string p = absl::StrCat("layer ", l, " ");
    RETURN_IF_ERROR(check_slice(L.gate(), cfg_.expert_ffn, cfg_.n_embd, in.slot_bytes(), p + "gate"));
    RETURN_IF_ERROR(check_slice(L.up(), cfg_.expert_ffn, cfg_.n_embd, in.slot_bytes(), p + "up"));
    RETURN_IF_ERROR(check_slice(L.down(), cfg_.n_embd, cfg_.expert_ffn, in.slot_bytes(), p + "down"));
  }
  const std::string& mech = in.arena_mechanism();
  const bool device = mech == "cuda-vmm-fd" || mech == "cuda-ipc";
  if (!device && mech != "memfd") {
    return absl::FailedPreconditionError(absl::StrCat("the expert store at ", options_.address, " has a '", mech,
                                                      "' arena, which this client does not know"));
  }
  if (device != options_.device_arena) {
    return absl::FailedPreconditionError(
        options_.device_arena
            ? absl::StrCat("the CUDA backend reads experts from a device arena; the expert store at ", options_.address,
                           " has a ", mech, " arena (start it with --arena device)")
            : absl::StrCat("the CPU backend reads experts from host memory; the expert store at ", options_.address,
                           " has a ", mech, " arena (start it with --arena host)"));
  }
  return absl::OkStatus();
}

StatusOr<std::vector<int>> ExpertClient::receive_fds(const pb::SessionInfo& in, size_t n_fds) {
  ASSIGN_OR_RETURN(const int sock, ipc::connect_unix(in.fd_socket()));
  std::vector<int> fds;
  std::string reply;
  Status st = ipc::send_fds(sock, {}, absl::StrCat(in.session_id()));
  if (st.ok()) st = ipc::recv_fds(sock, 3, &fds, &reply);
  ::close(sock);
  RETURN_IF_ERROR(st);
  if (reply != "ok" || fds.size() != n_fds) {
    for (int fd : fds) ::close(fd);
    return absl::UnavailableError(absl::StrCat("fd hand-over on ", in.fd_socket(), " refused: ", reply));
  }
  return fds;
}

// Maps the arena (or imports the device arena), the slot table and the lease table. Each fd
// goes to its owner (the mappings take theirs, also on failure); an early return closes those
// not handed over yet.
Status ExpertClient::map_session(Session& s, std::vector<int>& fds) const {
  const pb::SessionInfo& in = s.info;
  const size_t n_fds = fds.size();
  auto take = [&fds](size_t i) { return std::exchange(fds[i], -1); };
  absl::Cleanup close_rest = [&fds] {
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  };
  ASSIGN_OR_RETURN(s.table_mem, ipc::SharedRegion::map(take(n_fds - 2), false));
  ASSIGN_OR_RETURN(s.lease_mem, ipc::SharedRegion::map(take(n_fds - 1), true));
  const uint64_t slots_bytes = uint64_t{in.n_slots()} * in.slot_bytes();
  if (options_.device_arena) {
    auto mapped = expertstore::DeviceArenaMapping::import(in.arena_mechanism(), n_fds == 3 ? take(0) : -1,
                                                          in.cuda_ipc_handle(), in.arena_bytes(), options_.device);
    if (!mapped.ok()) {
      return absl::Status(mapped.status().code(), absl::StrCat("importing the expert store's device arena: ",
                                                               mapped.status().message()));
    }
    s.device_arena = std::move(*mapped);
    if (s.device_arena->bytes() < slots_bytes) return absl::FailedPreconditionError("the expert arena is smaller than its slots");
  } else {
    ASSIGN_OR_RETURN(s.arena, ipc::SharedRegion::map(take(0), false));
    if (s.arena.size() < in.arena_bytes() || slots_bytes > s.arena.size()) {
      return absl::FailedPreconditionError("the expert arena is smaller than its slots");
    }
  }
  ASSIGN_OR_RETURN(s.table, expertstore::SlotTable::attach(s.table_mem.data(), s.table_mem.size(), s.lease_mem.data(),
                                                           s.lease_mem.size()));
  const auto& h = s.table.header();
  if (h.n_slots != in.n_slots() || h.slot_bytes != in.slot_bytes() || h.n_layers != in.n_layers() ||
      h.n_experts != in.n_experts() || in.lease_row() >= expertstore::kSessions) {
    return absl::FailedPreconditionError("the slot table disagrees with the session description");
  }
  return absl::OkStatus();
}

model::ExpertWeights ExpertClient::view(const Session& s, int layer, uint32_t slot) const {
  const uint8_t* arena = s.device_arena ? s.device_arena->data() : s.arena.data();
  const uint8_t* base = arena + uint64_t{slot} * s.info.slot_bytes();
  auto w = [base](const pb::SliceLayout& x) {
    kernels::Weight k;
    k.type = static_cast<quant::GgmlType>(x.ggml_type());
    k.cols = static_cast<int64_t>(x.cols());
    k.rows = static_cast<int64_t>(x.rows());
    k.row_bytes = x.bytes() / x.rows();
    k.data = base + x.slot_offset();
    k.layout = x.tiles() ? kernels::WeightLayout::kTiles16 : kernels::WeightLayout::kGguf;
    return k;
  };
  const auto& L = s.info.layers(layer);
  return model::ExpertWeights{w(L.gate()), w(L.up()), w(L.down()), slot, arena, s.info.slot_bytes()};
}

const uint8_t* ExpertClient::arena_base() const {
  std::shared_ptr<Session> s = current();
  if (!s) return nullptr;
  return s->device_arena ? s->device_arena->data() : s->arena.data();
}

size_t ExpertClient::lease_budget() const {
  std::shared_ptr<Session> s = current();
  return s ? std::max<size_t>(1, s->info.n_slots()) : SIZE_MAX;
}

StatusOr<model::ExpertWeights> ExpertClient::acquire(int layer, int expert) {
  if (layer < 0 || expert < 0 || static_cast<uint32_t>(layer) >= cfg_.n_layer || static_cast<uint32_t>(expert) >= cfg_.n_expert) {
    return absl::OutOfRangeError(absl::StrCat("no expert ", expert, " in layer ", layer));
  }
  std::shared_ptr<Session> s = current();
  if (!s) return availability();
  const auto t0 = Clock::now();
  const uint32_t row = s->info.lease_row();
  expertstore::Lease lease;
  const auto hit = s->table.try_acquire(row, static_cast<uint32_t>(layer), static_cast<uint32_t>(expert), s->table.next_tick());
  if (hit) {
    lease = *hit;
    s->table.count_hit(row);
    ++hits_;
  } else {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + options_.acquire_timeout);
    pb::AcquireRequest req;
    req.set_session_id(s->info.session_id());
    auto* e = req.add_experts();
    e->set_layer(static_cast<uint32_t>(layer));
    e->set_expert(static_cast<uint32_t>(expert));
    pb::AcquireResponse resp;
    const grpc::Status st = s->stub->Acquire(&ctx, req, &resp);
    if (!st.ok()) {
      return from_grpc(st, absl::StrCat("expert store at ", options_.address, ": acquiring expert ", expert, " of layer ", layer));
    }
    if (resp.grants_size() != 1 || resp.grants(0).slot() >= s->info.n_slots()) {
      return absl::InternalError("the expert store answered Acquire with a malformed grant");
    }
    lease = expertstore::Lease{row, resp.grants(0).slot(), resp.grants(0).generation()};
    ++misses_;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    held_.emplace(std::make_pair(layer, expert), std::make_shared<Held>(Held{s, lease}));
  }
  if (observer_) observer_(hit.has_value(), std::chrono::duration<double>(Clock::now() - t0).count());
  return view(*s, layer, lease.slot);
}

void ExpertClient::release(int layer, int expert) {
  std::shared_ptr<Held> h;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = held_.find(std::make_pair(layer, expert));
    if (it == held_.end()) return;
    h = it->second;
    held_.erase(it);
  }
  // After the session ended the store has dropped its leases (and may reuse its row).
  if (h->session->alive) h->session->table.release(h->lease);
}

void ExpertClient::prefetch(int layer, const std::vector<int>& experts) {
  std::shared_ptr<Session> s = current();
  if (!s || layer < 0 || static_cast<uint32_t>(layer) >= cfg_.n_layer) return;
  struct Call {
    grpc::ClientContext ctx;
    pb::PrefetchRequest req;
    pb::PrefetchResponse resp;
  };
  auto* call = new Call();
  for (int e : experts) {
    if (e < 0 || static_cast<uint32_t>(e) >= cfg_.n_expert) continue;
    if (s->table.resident_slot(static_cast<uint32_t>(layer), static_cast<uint32_t>(e)) != 0) continue;
    auto* r = call->req.add_experts();
    r->set_layer(static_cast<uint32_t>(layer));
    r->set_expert(static_cast<uint32_t>(e));
  }
  if (call->req.experts_size() < 2) {  // a lone miss goes straight to Acquire
    delete call;
    return;
  }
  call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  s->stub->async()->Prefetch(&call->ctx, &call->req, &call->resp, [call](grpc::Status) { delete call; });
}

bool ExpertClient::resident(int layer, int expert) const {
  std::shared_ptr<Session> s = current();
  return s && layer >= 0 && expert >= 0 && static_cast<uint32_t>(layer) < cfg_.n_layer &&
         static_cast<uint32_t>(expert) < cfg_.n_expert &&
         s->table.resident_slot(static_cast<uint32_t>(layer), static_cast<uint32_t>(expert)) != 0;
}

size_t ExpertClient::held() const {
  std::lock_guard<std::mutex> l(mu_);
  return held_.size();
}

}  // namespace dsflash::expertclient
