// The expert slice map: for every (layer, expert) the shard, file offset, byte count and GGML
// type of its gate, up and down matrices inside the merged 3-D tensors
// blk.L.ffn_{gate,up,down}_exps.weight (ne = [n_embd, ffn, n_expert] for gate/up and
// [ffn, n_embd, n_expert] for down), and the arena slot size that holds one expert with each
// matrix aligned. Built from a validated shard set; errors name the tensor and the problem.
#pragma once

#include <cstdint>
#include <vector>

#include "common/config/config.h"
#include "common/gguf/gguf.h"
#include "common/quant/quant.h"
#include "common/status.h"

namespace dsflash::expertstore {

inline constexpr uint64_t kSliceAlign = 4096;  // O_DIRECT-friendly and cache-line aligned

struct Slice {
  uint32_t shard = 0;
  uint64_t file_offset = 0;  // absolute, in the shard file
  uint64_t bytes = 0;
  quant::GgmlType type = quant::GgmlType::kF32;
  uint64_t slot_offset = 0;  // where it lives inside a slot
  int64_t rows = 0, cols = 0;
  bool tiles = false;  // kept in the slot in the device tile order (kernels/linear/tiles.h)
};

struct ExpertSlices {
  Slice gate, up, down;
};

class SliceMap {
 public:
  static StatusOr<SliceMap> build(const gguf::Model& model, const config::ModelConfig& cfg);

  uint32_t n_layers() const { return n_layers_; }
  uint32_t n_experts() const { return n_experts_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  // Bytes of the three matrices of one expert (without alignment padding).
  uint64_t expert_bytes() const { return expert_bytes_; }
  // Slices of (layer, expert); OutOfRange for an expert that does not exist.
  StatusOr<ExpertSlices> at(uint32_t layer, uint32_t expert) const;
  // Marks every slice whose type and shape have a tile layout (kernels::tile_layout_exists) to
  // be kept in it (a device arena's store).
  void use_tiles();

 private:
  uint32_t n_layers_ = 0, n_experts_ = 0;
  uint64_t slot_bytes_ = 0, expert_bytes_ = 0;
  std::vector<ExpertSlices> slices_;
};

}  // namespace dsflash::expertstore
