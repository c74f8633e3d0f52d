// The expert store as a real process (dsflash-expertstore) with real clients: the golden
// model computed through the store gives the in-process logits bit for bit (also with an
// arena too small for the model); a killed client's leases are reclaimed; a killed store
// fails acquires fast and the client reconnects when it returns; wrong models and bad
// requests get clear statuses; the inference service follows the store (UNAVAILABLE and
// readiness while it is down, back when it returns); start-up errors are clear.
#include <filesystem>
#include <fstream>

#include "common/config/config.h"
#include "common/gguf/gguf.h"
#include "gtest/gtest.h"
#include "inference_svc/expert_client/expert_client.h"
#include "inference_svc/model/model.h"
#include "tests/golden_data.h"
#include "tests/service/server_process.h"

namespace dsflash::testing {
namespace {

namespace pb = dsflash::v1;
using namespace std::chrono_literals;

std::string golden_model() { return golden_dir() + "/tiny_a.gguf"; }

struct Golden {
  std::unique_ptr<gguf::Model> file;
  config::ModelConfig cfg;
  std::string fingerprint;
  Golden() {
    file = std::move(*gguf::Model::open(golden_model()));
    cfg = *config::from_gguf(*file);
    fingerprint = *file->fingerprint("_exps.");
  }
  std::unique_ptr<expertclient::ExpertClient> client(const std::string& address) const {
    return std::make_unique<expertclient::ExpertClient>(
        expertclient::ClientOptions{.address = address, .model_fingerprint = fingerprint, .reconnect_interval = 100ms}, cfg);
  }
};

// Prefill of 17 golden prompt tokens (all logits) and three decode steps.
std::vector<std::vector<float>> run_golden(const model::Model& m) {
  const auto tokens = testing::Golden::get().ints("prompt.len17.tokens");
  auto seq = m.new_sequence();
  std::vector<std::vector<float>> out(4);
  EXPECT_TRUE(m.forward(*seq, tokens, true, &out[0]).ok());
  int i = 1;
  for (int32_t t : {5, 77, 300}) EXPECT_TRUE(m.forward(*seq, {t}, false, &out[i++]).ok());
  return out;
}

TEST(ExpertStoreService, TwoProcessesGiveTheInProcessLogits) {
  Golden g;
  auto ref = model::Model::load(*g.file);
  ASSERT_TRUE(ref.ok());
  const auto want = run_golden(**ref);
  // 200 KiB holds 3 slots of the 24 experts: every layer evicts. 64 MiB holds them all.
  for (const std::string budget : {"200K", "64M"}) {
    TempDir dir;
    StoreProcess store(dir, golden_model(), budget);
    auto client = g.client(store.address());
    ASSERT_TRUE(client->wait_connected(10s).ok()) << client->availability() << store.process().log();
    expertclient::ExpertClient* c = client.get();
    auto m = model::Model::load(*g.file, std::move(client));
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(run_golden(**m), want) << "budget " << budget;
    EXPECT_EQ(c->held(), 0u);
    const pb::StoreStats st = store.stats();
    EXPECT_EQ(st.leased(), 0u);
    EXPECT_EQ(st.sessions(), 1u);
    EXPECT_GT(c->hits(), 0u);
    if (budget == "200K") {
      EXPECT_EQ(st.slots(), 3u);
      EXPECT_GT(st.evictions(), 0u);
    }
  }
}

TEST(ExpertStoreService, KillingAClientFreesItsLeases) {
  TempDir dir;
  StoreProcess store(dir, golden_model(), "64M");
  ChildProcess probe({DSF_PROBE_BIN, store.address(), golden_model(), "5"}, dir.file("probe.log"), true);
  ASSERT_EQ(probe.read_line(), "held 5") << probe.log();
  pb::StoreStats st = store.stats();
  EXPECT_EQ(st.leased(), 5u);
  EXPECT_EQ(st.sessions(), 1u);
  probe.kill9();
  const auto until = std::chrono::steady_clock::now() + 5s;
  while ((st = store.stats()).leased() != 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(st.leased(), 0u);
  EXPECT_EQ(st.sessions(), 0u);
  EXPECT_NE(store.process().log().find("5 leases dropped"), std::string::npos) << store.process().log();
}

TEST(ExpertStoreService, KilledStoreFailsFastAndTheClientReconnects) {
  Golden g;
  TempDir dir;
  StoreProcess store(dir, golden_model(), "64M");
  auto client = g.client(store.address());
  ASSERT_TRUE(client->wait_connected(10s).ok());
  ASSERT_TRUE(client->acquire(0, 0).ok());
  client->release(0, 0);
  store.process().kill9();
  const auto t0 = std::chrono::steady_clock::now();
  while (client->connected() && std::chrono::steady_clock::now() - t0 < 5s) std::this_thread::sleep_for(5ms);
  auto failed = client->acquire(1, 1);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  EXPECT_LT(waited, 1.0);
  ASSERT_TRUE(store.start());
  ASSERT_TRUE(client->wait_connected(10s).ok()) << client->availability();
  auto back = client->acquire(1, 1);
  ASSERT_TRUE(back.ok()) << back.status();
  client->release(1, 1);
}

// The CUDA backend streams from a device arena only; a host (memfd) arena is refused with the
// flag that fixes it, by the client (device_arena) and by the model load (a host client).
TEST(ExpertStoreService, CudaBackendNeedsADeviceArena) {
  Golden g;
  TempDir dir;
  StoreProcess store(dir, golden_model(), "64M", {"--arena", "host"});
  expertclient::ExpertClient device_client(expertclient::ClientOptions{.address = store.address(),
                                                                       .model_fingerprint = g.fingerprint,
                                                                       .reconnect_interval = 100ms,
                                                                       .device_arena = true},
                                           g.cfg);
  const Status refused = device_client.wait_connected(2s);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.message().find("start it with --arena device"), std::string::npos) << refused;
  EXPECT_EQ(device_client.memory(), kernels::Backend::kCuda);
  auto host_client = g.client(store.address());
  ASSERT_TRUE(host_client->wait_connected(10s).ok()) << host_client->availability();
  auto m = model::Model::load(*g.file, std::move(host_client), model::LoadOptions{kernels::Backend::kCuda});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(m.status().message().find("--arena device"), std::string::npos) << m.status();
}

TEST(ExpertStoreService, RefusesOtherModelsAndBadRequests) {
  TempDir dir;
  StoreProcess store(dir, golden_model(), "64M");
  // Health: liveness and the service.
  auto health = grpc::health::v1::Health::NewStub(store.channel());
  for (const char* svc : {"", "dsflash.v1.ExpertStore"}) {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(svc);
    grpc::health::v1::HealthCheckResponse resp;
    ASSERT_TRUE(health->Check(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  {  // another model
    grpc::ClientContext ctx;
    pb::OpenSessionRequest req;
    req.set_model_fingerprint("0123456789abcdef");
    auto reader = store.stub().OpenSession(&ctx, req);
    pb::SessionEvent ev;
    EXPECT_FALSE(reader->Read(&ev));
    const grpc::Status st = reader->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(st.error_message().find("fingerprint"), std::string::npos) << st.error_message();
  }
  {  // an unknown session
    grpc::ClientContext ctx;
    pb::AcquireRequest req;
    req.set_session_id(42);
    req.add_experts();
    pb::AcquireResponse resp;
    EXPECT_EQ(store.stub().Acquire(&ctx, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  // A real session: an expert that does not exist; a lease released twice.
  grpc::ClientContext sctx;
  auto reader = store.stub().OpenSession(&sctx, pb::OpenSessionRequest());
  pb::SessionEvent ev;
  ASSERT_TRUE(reader->Read(&ev));
  const uint64_t id = ev.info().session_id();
  EXPECT_EQ(ev.info().n_layers(), 6u);
  EXPECT_EQ(ev.info().arena_mechanism(), "memfd");
  {
    grpc::ClientContext ctx;
    pb::AcquireRequest req;
    req.set_session_id(id);
    req.add_experts()->set_layer(6);
    pb::AcquireResponse resp;
    const grpc::Status st = store.stub().Acquire(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::OUT_OF_RANGE);
    EXPECT_NE(st.error_message().find("layer 6"), std::string::npos) << st.error_message();
  }
  pb::AcquireResponse granted;
  {
    grpc::ClientContext ctx;
    pb::AcquireRequest req;
    req.set_session_id(id);
    auto* e = req.add_experts();
    e->set_layer(2);
    e->set_expert(3);
    ASSERT_TRUE(store.stub().Acquire(&ctx, req, &granted).ok());
    ASSERT_EQ(granted.grants_size(), 1);
  }
  for (auto want : {grpc::StatusCode::OK, grpc::StatusCode::FAILED_PRECONDITION}) {
    grpc::ClientContext ctx;
    pb::ReleaseRequest req;
    req.set_session_id(id);
    *req.add_leases() = granted.grants(0);
    pb::ReleaseResponse resp;
    EXPECT_EQ(store.stub().Release(&ctx, req, &resp).error_code(), want);
  }
  sctx.TryCancel();
  // Metrics: the store's families are exported.
  const std::string m = http_get(store.metrics_port(), "/metrics");
  for (const char* name : {"dsflash_expertstore_misses_total", "dsflash_expertstore_capacity_slots",
                           "dsflash_expertstore_load_stage_seconds_count", "dsflash_expertstore_sessions"}) {
    EXPECT_NE(m.find(name), std::string::npos) << name;
  }
  EXPECT_EQ(metric_value(m, "dsflash_expertstore_capacity_slots"), 24);
  if (std::system("command -v promtool > /dev/null") != 0) GTEST_SKIP() << "promtool not installed";
  write_all(dir.file("m.txt"), std::vector<uint8_t>(m.begin(), m.end()));
  EXPECT_EQ(std::system(("promtool check metrics < " + dir.file("m.txt")).c_str()), 0);
}

TEST(ExpertStoreService, StartupErrorsAreClear) {
  TempDir dir;
  struct Case {
    std::string model, budget, expect;
  };
  const std::string truncated = dir.file("truncated.gguf");
  {
    const auto bytes = read_all(golden_model());
    std::ofstream(truncated, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                     static_cast<std::streamsize>(bytes.size() / 2));
  }
  const std::string not_gguf = dir.file("readme.gguf");
  std::ofstream(not_gguf) << "not a model";
  for (const Case& c : {Case{dir.file("missing.gguf"), "64M", "missing.gguf"}, Case{golden_model(), "10K", "top-2"},
                        Case{truncated, "64M", "truncated.gguf"}, Case{not_gguf, "64M", "readme.gguf"}}) {
    ChildProcess p({DSF_EXPERTSTORE_BIN, "--model", c.model, "--budget", c.budget, "--listen",
                    "unix:" + dir.file("s.sock"), "--metrics", "off"},
                   dir.file("err.log"));
    EXPECT_EQ(p.wait_exit(20s), 1) << c.model;
    EXPECT_NE(p.log().find(c.expect), std::string::npos) << p.log();
  }
  ChildProcess bad({DSF_EXPERTSTORE_BIN, "--model", golden_model(), "--budget", "lots"}, dir.file("flags.log"));
  EXPECT_EQ(bad.wait_exit(10s), 2);
  EXPECT_NE(bad.log().find("--budget"), std::string::npos) << bad.log();
}

// The inference service with --expert-store: serves through the store; when the store dies
// mid-generation the stream fails with UNAVAILABLE within a second, readiness drops and new
// requests are refused; when the store returns, everything works again without a restart.
TEST(ExpertStoreService, InferenceServiceFollowsTheStore) {
  TempDir dir;
  const std::string model = dir.file("tiny.gguf");
  ASSERT_TRUE(tools::write_synthetic_model(tools::SynthOptions{}, model, 1).ok());
  StoreProcess store(dir, model, "2M");
  ServerProcess server({"--expert-store", store.address()}, true, model);
  ASSERT_TRUE(server.ready()) << server.log();
  pb::GenerateRequest req;
  req.set_prompt("Hello world");
  req.mutable_sampling()->set_temperature(0.0f);
  req.mutable_stopping()->set_max_new_tokens(8);
  req.mutable_stopping()->set_ignore_eos(true);
  const StreamResult first = run_stream(server.stub(), req);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.ids().size(), 8u);
  const std::string sm = http_get(store.metrics_port(), "/metrics");
  EXPECT_GT(metric_value(sm, "dsflash_expertstore_hits_total"), 0);
  EXPECT_EQ(metric_value(sm, "dsflash_expertstore_sessions"), 1);
  EXPECT_EQ(metric_value(server.metrics(), "llm_expert_store_up"), 1);

  // Kill the store while a long generation streams.
  pb::GenerateRequest longer = req;
  longer.mutable_stopping()->set_max_new_tokens(200);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  auto reader = server.stub().Generate(&ctx, longer);
  pb::GenerateEvent ev;
  ASSERT_TRUE(reader->Read(&ev)) << reader->Finish().error_message();
  store.process().kill9();
  const auto killed = std::chrono::steady_clock::now();
  while (reader->Read(&ev)) {
  }
  const grpc::Status st = reader->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count(), 1.0);
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (server.serving("dsflash.v1.Inference") && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(server.serving("dsflash.v1.Inference"));
  EXPECT_TRUE(server.serving(""));  // alive
  const StreamResult refused = run_stream(server.stub(), req);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(refused.status.error_message().find("expert store"), std::string::npos) << refused.status.error_message();
  EXPECT_EQ(metric_value(server.metrics(), "llm_expert_store_up"), 0);

  ASSERT_TRUE(store.start());
  ASSERT_TRUE(server.wait_ready(10s)) << server.log();
  const StreamResult again = run_stream(server.stub(), req);
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.ids(), first.ids());  // same greedy tokens through the new store
  EXPECT_EQ(server.stop(), 0);
}

}  // namespace
}  // namespace dsflash::testing
