// The device expert arena on a real GPU (label gpu; skipped without one): the store loads
// golden-model experts into device slots whose bytes equal the file's, with either sharing
// mechanism; and a second process (dsflash-expertstore) exports its device arena — by VMM
// POSIX fd over SCM_RIGHTS, or by legacy CUDA IPC handle — which this process imports and
// reads: the bytes in the leased slot equal the bytes in the file.
#include <cuda_runtime.h>

#include <cstring>

#include "common/gguf/gguf.h"
#include "common/ipc/shm.h"
#include "expertstore_svc/arena.h"
#include "expertstore_svc/store.h"
#include "gtest/gtest.h"
#include "kernels/exec.h"
#include "tests/service/server_process.h"

namespace dsflash::testing {
namespace {

namespace pb = dsflash::v1;
using namespace std::chrono_literals;

std::string golden_model() { return golden_dir() + "/tiny_a.gguf"; }

// The file bytes of an expert's three slices, and the same ranges read from device memory.
void expect_slot_equals_file(const expertstore::SliceMap& map, const gguf::Model& file, const uint8_t* device_slot,
                             uint32_t layer, uint32_t expert) {
  const expertstore::ExpertSlices sl = *map.at(layer, expert);
  for (const expertstore::Slice* s : {&sl.gate, &sl.up, &sl.down}) {
    std::vector<uint8_t> want(s->bytes), got(s->bytes, 0xAB);
    ASSERT_TRUE(file.shard(s->shard).pread(s->file_offset, want.data(), want.size()).ok());
    ASSERT_EQ(cudaMemcpy(got.data(), device_slot + s->slot_offset, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(got, want) << "layer " << layer << " expert " << expert;
  }
}

class DeviceArena : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!kernels::cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(DeviceArena, StoreLoadsFileBytesIntoDeviceSlots) {
  auto store = expertstore::Store::open(
      golden_model(), expertstore::StoreOptions{.budget_bytes = 4 << 20, .arena = "device", .device_mechanism = GetParam()});
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->arena().mechanism(), GetParam());
  auto file = gguf::Model::open(golden_model());
  ASSERT_TRUE(file.ok());
  for (auto [l, e] : {std::pair{0u, 1u}, {5u, 3u}, {2u, 0u}}) {
    auto lease = (*store)->acquire(expertstore::Store::kLocal, l, e);
    ASSERT_TRUE(lease.ok()) << lease.status();
    const uint8_t* slot = (*store)->arena().device_data() + uint64_t{lease->slot} * (*store)->slices().slot_bytes();
    expect_slot_equals_file((*store)->slices(), **file, slot, l, e);
    ASSERT_TRUE((*store)->release(*lease).ok());
  }
}

TEST_P(DeviceArena, SecondProcessImportsTheArena) {
  TempDir dir;
  StoreProcess store(dir, golden_model(), "4M", {"--arena", "device", "--device-sharing", GetParam()});
  ASSERT_TRUE(store.process().running()) << store.process().log();
  grpc::ClientContext sctx;
  auto reader = store.stub().OpenSession(&sctx, pb::OpenSessionRequest());
  pb::SessionEvent ev;
  ASSERT_TRUE(reader->Read(&ev)) << store.process().log();
  const pb::SessionInfo& info = ev.info();
  EXPECT_EQ(info.arena_mechanism(), GetParam());
  auto sock = ipc::connect_unix(info.fd_socket());
  ASSERT_TRUE(sock.ok());
  std::vector<int> fds;
  std::string reply;
  ASSERT_TRUE(ipc::send_fds(*sock, {}, std::to_string(info.session_id())).ok());
  ASSERT_TRUE(ipc::recv_fds(*sock, 3, &fds, &reply).ok());
  ::close(*sock);
  ASSERT_EQ(reply, "ok");
  const bool has_fd = GetParam() == "cuda-vmm-fd";
  ASSERT_EQ(fds.size(), has_fd ? 3u : 2u);
  const auto t0 = std::chrono::steady_clock::now();
  auto mapping = expertstore::DeviceArenaMapping::import(info.arena_mechanism(), has_fd ? fds[0] : -1,
                                                         info.cuda_ipc_handle(), info.arena_bytes(), 0);
  const double import_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(mapping.ok()) << mapping.status();
  std::printf("imported a %s arena of %llu bytes in %.3f ms\n", GetParam().c_str(),
              static_cast<unsigned long long>(info.arena_bytes()), import_ms);
  for (size_t i = has_fd ? 1 : 0; i < fds.size(); ++i) ::close(fds[i]);
  auto file = gguf::Model::open(golden_model());
  auto cfg = config::from_gguf(**file);
  auto map = expertstore::SliceMap::build(**file, *cfg);
  ASSERT_TRUE(map.ok());
  for (auto [l, e] : {std::pair{1u, 2u}, {4u, 0u}}) {
    grpc::ClientContext ctx;
    pb::AcquireRequest req;
    req.set_session_id(info.session_id());
    auto* x = req.add_experts();
    x->set_layer(l);
    x->set_expert(e);
    pb::AcquireResponse resp;
    ASSERT_TRUE(store.stub().Acquire(&ctx, req, &resp).ok());
    const uint8_t* slot = (*mapping)->data() + uint64_t{resp.grants(0).slot()} * info.slot_bytes();
    expect_slot_equals_file(*map, **file, slot, l, e);
  }
  mapping->reset();
  sctx.TryCancel();
}

INSTANTIATE_TEST_SUITE_P(Mechanisms, DeviceArena, ::testing::Values("cuda-vmm-fd", "cuda-ipc"));

}  // namespace
}  // namespace dsflash::testing
