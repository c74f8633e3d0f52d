// Routed experts streamed on the GPU (label gpu; skipped without one): the real
// dsflash-expertstore with a device arena as a second process, this process on the CUDA
// backend importing the arena (ExpertClient) — the logits equal the single-process CUDA run
// with every expert resident, bit for bit, with an arena too small for the experts (every layer
// evicts) and one that holds them all, with and without next-layer prefetch; a store killed
// mid-generation fails the forward with UNAVAILABLE and the model works again once it is back.
// The store keeps the quantised experts in the GPU tile order (kernels/linear/tiles.h) by
// default, and the GGUF order with --expert-tiles false; both give the resident logits.
#include <cuda_runtime.h>

#include <cstdio>

#include "common/gguf/gguf.h"
#include "expertstore_svc/slice_map.h"
#include "expertstore_svc/store.h"
#include "kernels/linear/tiles.h"
#include "gtest/gtest.h"
#include "inference_svc/expert_client/expert_client.h"
#include "inference_svc/model/model.h"
#include "tests/golden_data.h"
#include "tests/service/child_process.h"
#include "tests/test_util.h"
#include "tools/dsflash/synth_model.h"

namespace dsflash::testing {
namespace {

namespace pb = dsflash::v1;
using namespace std::chrono_literals;
using model::LoadOptions;
using model::Model;

// A model file with what the store needs to know about it.
struct ModelFile {
  std::string path;
  std::unique_ptr<gguf::Model> file;
  config::ModelConfig cfg;
  std::string fingerprint;
  uint64_t slot_bytes = 0;
  explicit ModelFile(std::string p) : path(std::move(p)) {
    auto f = gguf::Model::open(path);
    EXPECT_TRUE(f.ok()) << f.status();
    file = std::move(*f);
    cfg = *config::from_gguf(*file);
    fingerprint = *file->fingerprint("_exps.");
    auto map = expertstore::SliceMap::build(*file, cfg);
    EXPECT_TRUE(map.ok()) << map.status();
    slot_bytes = map->slot_bytes();
  }
  std::unique_ptr<expertclient::ExpertClient> client(const std::string& address) const {
    return std::make_unique<expertclient::ExpertClient>(
        expertclient::ClientOptions{.address = address,
                                    .model_fingerprint = fingerprint,
                                    .reconnect_interval = 100ms,
                                    .device_arena = true},
        cfg);
  }
  // Arena bytes for n slots.
  std::string budget(uint64_t n) const { return std::to_string(n * slot_bytes); }
};

// Prefill of a 17-token prompt (all logits), then `steps` decode steps feeding back the argmax.
std::vector<std::vector<float>> generate(const Model& m, int steps, Status* failed = nullptr) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 17; ++i) prompt.push_back((i * 37 + 11) % static_cast<int>(m.config().n_vocab));
  auto seq = m.new_sequence();
  EXPECT_NE(seq, nullptr);
  std::vector<std::vector<float>> out(1);
  Status s = m.forward(*seq, prompt, true, &out[0]);
  for (int i = 0; i < steps && s.ok(); ++i) {
    const std::vector<float>& last = out.back();
    const int64_t V = m.config().n_vocab;
    const auto* row = last.data() + last.size() - V;
    const int32_t next = static_cast<int32_t>(std::max_element(row, row + V) - row);
    out.emplace_back();
    s = m.forward(*seq, {next}, false, &out.back());
  }
  if (failed != nullptr) {
    *failed = s;
  } else {
    EXPECT_TRUE(s.ok()) << s;
  }
  return out;
}

class StreamedCuda : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!kernels::cuda_available()) GTEST_SKIP() << "no CUDA device";
    if (GetParam() == "golden") {
      model_ = std::make_unique<ModelFile>(golden_dir() + "/tiny_a.gguf");
    } else {  // the release's quantised types: the decode GEMVs take the experts' slots
      const std::string path = dir_.file("tiny.gguf");
      ASSERT_TRUE(tools::write_synthetic_model(tools::SynthOptions{}, path, 1).ok());
      model_ = std::make_unique<ModelFile>(path);
    }
  }
  TempDir dir_;
  std::unique_ptr<ModelFile> model_;
};

TEST_P(StreamedCuda, TwoProcessesGiveTheResidentLogits) {
  const ModelFile& m = *model_;
  auto resident = Model::load(*m.file, nullptr, LoadOptions{kernels::Backend::kCuda});
  ASSERT_TRUE(resident.ok()) << resident.status();
  const auto want = generate(**resident, 12);
  const uint64_t all = uint64_t{m.cfg.n_layer} * m.cfg.n_expert;
  // n_expert_used + 1 slots: every layer evicts; all: nothing does. The GGUF order once.
  struct Run {
    uint64_t slots;
    bool prefetch, tiles;
  };
  const uint64_t few = uint64_t{m.cfg.n_expert_used} + 1;
  for (const Run& r : {Run{few, true, true}, Run{few, false, true}, Run{all, true, true}, Run{all, false, true},
                       Run{few, false, false}}) {
    const uint64_t slots = r.slots;
    const bool prefetch = r.prefetch;
    {
      SCOPED_TRACE(::testing::Message() << slots << " slots, prefetch " << prefetch << ", tiles " << r.tiles);
      TempDir dir;
      StoreProcess store(dir, m.path, m.budget(slots), {"--arena", "device", "--expert-tiles", r.tiles ? "true" : "false"});
      auto client = m.client(store.address());
      ASSERT_TRUE(client->wait_connected(20s).ok()) << client->availability() << store.process().log();
      expertclient::ExpertClient* c = client.get();
      auto streamed = Model::load(*m.file, std::move(client), LoadOptions{kernels::Backend::kCuda, prefetch});
      ASSERT_TRUE(streamed.ok()) << streamed.status();
      const auto got = generate(**streamed, 12);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "call " << i;
      // Decode after the first step replays segment chains (slot GEMVs, no prediction): the
      // same logits as the resident graphs; the golden file's experts run eagerly.
      if (GetParam() != "golden" && !prefetch) {
        EXPECT_EQ((*streamed)->decode_graph_replays(), 11);
      } else {
        EXPECT_EQ((*streamed)->decode_graph_replays(), 0);
      }
      EXPECT_EQ(c->held(), 0u);
      const pb::StoreStats st = store.stats();
      EXPECT_EQ(st.leased(), 0u);
      EXPECT_EQ(st.slots(), slots);
      if (slots < all) {
        EXPECT_GT(st.evictions(), 0u);
      }
      std::printf("%s, %llu slots, prefetch %d: hits %llu misses %llu evictions %llu prefetches %llu\n",
                  GetParam().c_str(), static_cast<unsigned long long>(slots), prefetch,
                  static_cast<unsigned long long>(c->hits()), static_cast<unsigned long long>(c->misses()),
                  static_cast<unsigned long long>(st.evictions()), static_cast<unsigned long long>(st.prefetches()));
    }
  }
}

// A device arena's slots hold the file's bytes, in the tile order where the slice has one
// (the synthetic file's Q2_K / Q3_K experts; the golden file's float ones keep the GGUF order)
// unless tiles are off.
TEST_P(StreamedCuda, DeviceSlotsHoldTheFileBytesInTheirOrder) {
  const ModelFile& m = *model_;
  for (const bool tiles : {true, false}) {
    auto store = expertstore::Store::open(
        m.path, expertstore::StoreOptions{.budget_bytes = (m.cfg.n_expert_used + 1) * m.slot_bytes, .arena = "device", .tiles = tiles});
    ASSERT_TRUE(store.ok()) << store.status();
    int tiled = 0;
    for (auto [l, e] : {std::pair{0u, 1u}, {m.cfg.n_layer - 1, m.cfg.n_expert - 1}}) {
      auto lease = (*store)->acquire(expertstore::Store::kLocal, l, e);
      ASSERT_TRUE(lease.ok()) << lease.status();
      const uint8_t* slot = (*store)->arena().device_data() + uint64_t{lease->slot} * (*store)->slices().slot_bytes();
      const expertstore::ExpertSlices sl = *(*store)->slices().at(l, e);
      for (const expertstore::Slice* s : {&sl.gate, &sl.up, &sl.down}) {
        std::vector<uint8_t> file(s->bytes), want(s->bytes), got(s->bytes);
        ASSERT_TRUE(m.file->shard(s->shard).pread(s->file_offset, file.data(), file.size()).ok());
        want = file;
        const int block = static_cast<int>(quant::traits(s->type).block_bytes);
        if (s->tiles) {
          kernels::tiles::repack(block, s->rows, s->cols / static_cast<int64_t>(quant::traits(s->type).block_elems),
                                 file.data(), want.data());
          ++tiled;
        }
        ASSERT_EQ(cudaMemcpy(got.data(), slot + s->slot_offset, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_EQ(got, want) << "layer " << l << " expert " << e << " tiles " << s->tiles;
      }
      ASSERT_TRUE((*store)->release(*lease).ok());
    }
    EXPECT_EQ(tiled, tiles && GetParam() != "golden" ? 6 : 0);
  }
}

TEST_P(StreamedCuda, KilledStoreFailsTheForwardAndTheModelRecovers) {
  const ModelFile& m = *model_;
  auto resident = Model::load(*m.file, nullptr, LoadOptions{kernels::Backend::kCuda});
  ASSERT_TRUE(resident.ok()) << resident.status();
  const auto want = generate(**resident, 4);
  TempDir dir;
  StoreProcess store(dir, m.path, m.budget(m.cfg.n_expert_used + 1), {"--arena", "device"});
  auto client = m.client(store.address());
  ASSERT_TRUE(client->wait_connected(20s).ok()) << client->availability() << store.process().log();
  expertclient::ExpertClient* c = client.get();
  auto streamed = Model::load(*m.file, std::move(client), LoadOptions{kernels::Backend::kCuda});
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  auto seq = (*streamed)->new_sequence();
  std::vector<float> logits;
  ASSERT_TRUE((*streamed)->forward(*seq, {1, 2, 3, 4, 5}, false, &logits).ok());
  store.process().kill9();
  const auto t0 = std::chrono::steady_clock::now();
  while (c->connected() && std::chrono::steady_clock::now() - t0 < 5s) std::this_thread::sleep_for(5ms);
  const Status failed = (*streamed)->forward(*seq, {6}, false, &logits);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_LT(s, 2.0);
  EXPECT_EQ(c->held(), 0u);  // the failed forward gave back what it held
  ASSERT_TRUE(store.start());
  ASSERT_TRUE(c->wait_connected(20s).ok()) << c->availability() << store.process().log();
  const auto got = generate(**streamed, 4);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "call " << i;
}

INSTANTIATE_TEST_SUITE_P(Models, StreamedCuda, ::testing::Values("golden", "synthetic"));

}  // namespace
}  // namespace dsflash::testing
