// Test harness: runs the real dsflash-inference binary as a child process on a synthetic
// tiny model, with a unix-socket gRPC address and a free metrics port; stubs and a metrics
// scrape for the tests. The process is stopped with SIGTERM (then SIGKILL) at scope exit.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "dsflash/v1/inference.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/service/child_process.h"
#include "tests/test_util.h"
#include "tools/dsflash/synth_model.h"

namespace dsflash::testing {

// The inference binary: $DSF_INFERENCE_BIN (a bundle on the GPU machine), else this build's.
inline std::string inference_bin() {
  const char* e = std::getenv("DSF_INFERENCE_BIN");
  return e != nullptr && *e != '\0' ? e : DSF_INFERENCE_BIN;
}

class ServerProcess {
 public:
  // Starts the server; waits until it is ready unless wait_ready is false (then only until
  // its socket exists).
  // `model`: a GGUF to serve; empty: a synthetic tiny model written for this server.
  explicit ServerProcess(std::vector<std::string> extra = {}, bool wait_ready = true, std::string model = "") {
    model_ = model;
    if (model_.empty()) {
      model_ = dir_.file("tiny.gguf");
      tools::SynthOptions o;
      auto w = tools::write_synthetic_model(o, model_, 1);
      EXPECT_TRUE(w.ok()) << w.status();
    }
    sock_ = "unix:" + dir_.file("inference.sock");
    metrics_port_ = free_tcp_port();
    std::vector<std::string> args = {inference_bin(), "--model", model_, "--listen", sock_,
                                     "--metrics", "127.0.0.1:" + std::to_string(metrics_port_)};
    args.insert(args.end(), extra.begin(), extra.end());
    proc_.start(args, dir_.file("server.log"));
    // The socket appears once the model is loaded; connecting earlier would only start gRPC's
    // reconnect backoff (seconds).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!std::filesystem::exists(sock_.substr(5)) && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    channel_ = grpc::CreateChannel(sock_, grpc::InsecureChannelCredentials());
    stub_ = dsflash::v1::Inference::NewStub(channel_);
    health_ = grpc::health::v1::Health::NewStub(channel_);
    if (wait_ready) ready_ = this->wait_ready(std::chrono::seconds(30));
  }
  ~ServerProcess() { stop(); }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  bool ready() const { return ready_; }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  // Polls readiness (health of dsflash.v1.Inference) for up to `limit`.
  bool wait_ready(std::chrono::seconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      if (serving("dsflash.v1.Inference")) return ready_ = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  bool serving(const std::string& service) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    return health_->Check(&ctx, req, &resp).ok() && resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  }
  dsflash::v1::Inference::Stub& stub() { return *stub_; }
  grpc::health::v1::Health::Stub& health() { return *health_; }
  std::string metrics() const { return http_get(metrics_port_, "/metrics"); }
  const std::string& model_path() const { return model_; }
  const std::string& address() const { return sock_; }  // the gRPC address (unix:...)
  pid_t pid() const { return proc_.pid(); }
  std::string log() const { return proc_.log(); }

  // Sends SIGTERM and waits; returns the exit status (or -1 if it had to be killed).
  int stop(std::chrono::seconds wait = std::chrono::seconds(20)) { return proc_.stop(wait); }

 private:
  TempDir dir_;
  std::string model_, sock_;
  int metrics_port_ = 0;
  ChildProcess proc_;
  bool ready_ = false;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<dsflash::v1::Inference::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

// Runs a Generate to the end; returns the events and the status.
struct StreamResult {
  std::vector<dsflash::v1::GenerateEvent> events;
  grpc::Status status;
  std::string text() const {
    std::string t;
    for (const auto& e : events) {
      if (e.has_tokens()) t += e.tokens().text_delta();
    }
    return t;
  }
  std::vector<uint32_t> ids() const {
    std::vector<uint32_t> v;
    for (const auto& e : events) {
      if (e.has_tokens()) v.insert(v.end(), e.tokens().token_ids().begin(), e.tokens().token_ids().end());
    }
    return v;
  }
};

inline StreamResult run_stream(dsflash::v1::Inference::Stub& stub, const dsflash::v1::GenerateRequest& req,
                               std::chrono::milliseconds deadline = std::chrono::milliseconds(60000)) {
  StreamResult r;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  auto reader = stub.Generate(&ctx, req);
  dsflash::v1::GenerateEvent ev;
  while (reader->Read(&ev)) r.events.push_back(ev);
  r.status = reader->Finish();
  return r;
}

}  // namespace dsflash::testing
