// The real dsflash-expertstore as a child process of a benchmark, stopped (SIGTERM) at scope
// exit (bench/expertstore_bench.cc, bench/expert_stream_bench.cc).
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

extern char** environ;

namespace dsflash::bench {

class StoreProcess {
 public:
  StoreProcess() = default;
  StoreProcess(const StoreProcess&) = delete;
  StoreProcess& operator=(const StoreProcess&) = delete;
  ~StoreProcess() {
    if (pid_ > 0) ::kill(pid_, SIGTERM), ::waitpid(pid_, nullptr, 0);
  }
  // args[0]: the binary.
  Status start(std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    if (args.empty() || posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ) != 0) {
      pid_ = -1;
      return absl::FailedPreconditionError(absl::StrCat("cannot start ", args.empty() ? "(no binary)" : args[0]));
    }
    return absl::OkStatus();
  }

 private:
  pid_t pid_ = -1;
};

}  // namespace dsflash::bench
