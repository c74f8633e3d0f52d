// Test harness: a real child process (fork + exec) with its stderr in a log file, stopped
// with SIGTERM (then SIGKILL) or killed with SIGKILL; the expert store process on top of it;
// loopback helpers (a free port, an HTTP GET, a metric's value).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "dsflash/v1/expertstore.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/test_util.h"

namespace dsflash::testing {

inline int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// GET http://127.0.0.1:port/path; returns the body ("" on failure).
inline std::string http_get(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!::write(fd, req.data(), req.size());
  std::string resp;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) resp.append(buf, static_cast<size_t>(n));
  ::close(fd);
  const size_t body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

// Value of an unlabelled metric line "name value", or -1.
inline double metric_value(const std::string& text, const std::string& name) {
  size_t at = 0;
  while ((at = text.find(name, at)) != std::string::npos) {
    if ((at == 0 || text[at - 1] == '\n') && (text[at + name.size()] == ' ' || text[at + name.size()] == '{')) {
      const size_t sp = text.find(' ', at);
      return std::stod(text.substr(sp + 1, text.find('\n', sp) - sp - 1));
    }
    at += name.size();
  }
  return -1;
}

class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(const std::vector<std::string>& args, const std::string& log, bool stdout_pipe = false) {
    start(args, log, stdout_pipe);
  }
  ~ChildProcess() { stop(std::chrono::seconds(10)); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  void start(std::vector<std::string> args, const std::string& log, bool stdout_pipe = false) {
    int fds[2] = {-1, -1};
    if (stdout_pipe && ::pipe(fds) != 0) return;
    log_ = log;
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      FILE* f = std::freopen(log.c_str(), "a", stderr);
      (void)f;
      if (stdout_pipe) ::dup2(fds[1], 1);
      ::execv(argv[0], argv.data());
      _exit(127);
    }
    if (stdout_pipe) {
      ::close(fds[1]);
      out_ = fds[0];
    }
  }
  // One line of the child's stdout (stdout_pipe mode), "" at EOF.
  std::string read_line() {
    std::string line;
    char c;
    while (out_ >= 0 && ::read(out_, &c, 1) == 1 && c != '\n') line += c;
    return line;
  }
  pid_t pid() const { return pid_; }
  bool running() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      return false;
    }
    return true;
  }
  // SIGKILL and reap.
  void kill9() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
    exit_code_ = -1;
  }
  // SIGTERM, wait; returns the exit status (-1 if it had to be killed).
  int stop(std::chrono::seconds wait = std::chrono::seconds(20)) {
    if (out_ >= 0) ::close(out_), out_ = -1;
    if (pid_ <= 0) return exit_code_;
    ::kill(pid_, SIGTERM);
    const auto until = std::chrono::steady_clock::now() + wait;
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > until) {
        kill9();
        return exit_code_ = -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid_ = -1;
    return exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  // Waits for the process to exit by itself; its exit status, or -2 on timeout.
  int wait_exit(std::chrono::seconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (running()) {
      if (std::chrono::steady_clock::now() > until) return -2;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return exit_code_;
  }
  std::string log() const {
    const auto b = read_all(log_);
    return std::string(b.begin(), b.end());
  }

 private:
  pid_t pid_ = -1;
  int exit_code_ = 0;
  int out_ = -1;
  std::string log_;
};

#ifndef DSF_EXPERTSTORE_BIN
#define DSF_EXPERTSTORE_BIN ""  // a test that does not run the store
#endif

// The store binary: $DSF_EXPERTSTORE_BIN (a bundle on the GPU machine), else this build's.
inline std::string expertstore_bin() {
  const char* e = std::getenv("DSF_EXPERTSTORE_BIN");
  return e != nullptr && *e != '\0' ? e : DSF_EXPERTSTORE_BIN;
}

// The real dsflash-expertstore on a unix socket in `dir`, with a free metrics port.
class StoreProcess {
 public:
  StoreProcess(const TempDir& dir, const std::string& model, const std::string& budget, std::vector<std::string> extra = {})
      : dir_(dir), model_(model), budget_(budget), extra_(std::move(extra)) {
    sock_ = "unix:" + dir.file("expertstore.sock");
    metrics_port_ = free_tcp_port();
    start();
  }
  // (Re)starts on the same addresses; waits until it serves (or exits).
  bool start() {
    std::vector<std::string> args = {expertstore_bin(), "--model", model_, "--listen", sock_, "--budget", budget_,
                                     "--metrics", "127.0.0.1:" + std::to_string(metrics_port_)};
    args.insert(args.end(), extra_.begin(), extra_.end());
    std::filesystem::remove(sock_.substr(5));
    proc_.start(args, dir_.file("expertstore.log"));
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!std::filesystem::exists(sock_.substr(5)) && proc_.running() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    channel_ = grpc::CreateChannel(sock_, grpc::InsecureChannelCredentials());
    stub_ = dsflash::v1::ExpertStore::NewStub(channel_);
    return std::filesystem::exists(sock_.substr(5));
  }
  const std::string& address() const { return sock_; }
  int metrics_port() const { return metrics_port_; }
  ChildProcess& process() { return proc_; }
  dsflash::v1::ExpertStore::Stub& stub() { return *stub_; }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  dsflash::v1::StoreStats stats() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    dsflash::v1::StoreStats s;
    (void)stub_->GetStats(&ctx, dsflash::v1::GetStatsRequest(), &s);
    return s;
  }

 private:
  const TempDir& dir_;
  std::string model_, budget_, sock_;
  std::vector<std::string> extra_;
  int metrics_port_ = 0;
  ChildProcess proc_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<dsflash::v1::ExpertStore::Stub> stub_;
};

}  // namespace dsflash::testing
