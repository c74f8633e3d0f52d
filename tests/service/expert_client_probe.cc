// A real client process for the expert store tests: connects an ExpertClient to the store,
// leases the first N experts of layer 0 (and onwards), prints "held N", and waits to be
// killed (it never releases them).
//   expert_client_probe ADDRESS MODEL.gguf N
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "common/config/config.h"
#include "common/gguf/gguf.h"
#include "inference_svc/expert_client/expert_client.h"

int main(int argc, char** argv) {
  using namespace dsflash;
  if (argc != 4) {
    std::fprintf(stderr, "usage: expert_client_probe ADDRESS MODEL.gguf N\n");
    return 2;
  }
  auto file = gguf::Model::open(argv[2]);
  if (!file.ok()) return 1;
  auto cfg = config::from_gguf(**file);
  auto fp = (*file)->fingerprint("_exps.");
  if (!cfg.ok() || !fp.ok()) return 1;
  expertclient::ExpertClient client(expertclient::ClientOptions{.address = argv[1], .model_fingerprint = *fp}, *cfg);
  if (!client.wait_connected(std::chrono::seconds(10)).ok()) return 1;
  const int n = std::atoi(argv[3]);
  for (int i = 0; i < n; ++i) {
    auto w = client.acquire(i / static_cast<int>(cfg->n_expert), i % static_cast<int>(cfg->n_expert));
    if (!w.ok()) {
      std::fprintf(stderr, "%s\n", std::string(w.status().message()).c_str());
      return 1;
    }
  }
  std::printf("held %d\n", n);
  std::fflush(stdout);
  for (;;) ::pause();
}
