#include "expertstore_svc/slice_map.h"

#include "absl/strings/str_cat.h"
#include "kernels/linear/linear_cuda.h"

namespace dsflash::expertstore {
namespace {

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// The merged tensor of one matrix kind in layer l, checked against the expected shape.
StatusOr<const gguf::TensorInfo*> merged(const gguf::Model& m, uint32_t l, const char* kind, uint64_t ne0, uint64_t ne1,
                                         uint64_t ne2) {
  const std::string name = absl::StrCat("blk.", l, ".ffn_", kind, "_exps.weight");
  const gguf::TensorInfo* t = m.find_tensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("expert tensor ", name, " is missing"));
  if (t->ne != std::vector<uint64_t>{ne0, ne1, ne2}) {
    return absl::InvalidArgumentError(absl::StrCat("expert tensor ", name, " has shape ", t->shape_string(), ", expected [",
                                                   ne0, ", ", ne1, ", ", ne2, "]"));
  }
  if (!quant::traits(t->type).can_decode) {
    return absl::InvalidArgumentError(absl::StrCat("expert tensor ", name, " has type ", quant::traits(t->type).name,
                                                   ", which dsflash cannot compute with"));
  }
  return t;
}

}  // namespace

StatusOr<SliceMap> SliceMap::build(const gguf::Model& m, const config::ModelConfig& c) {
  SliceMap map;
  map.n_layers_ = c.n_layer;
  map.n_experts_ = c.n_expert;
  const uint64_t D = c.n_embd, F = c.expert_ffn, E = c.n_expert;
  for (uint32_t l = 0; l < c.n_layer; ++l) {
    ASSIGN_OR_RETURN(const gguf::TensorInfo* g, merged(m, l, "gate", D, F, E));
    ASSIGN_OR_RETURN(const gguf::TensorInfo* u, merged(m, l, "up", D, F, E));
    ASSIGN_OR_RETURN(const gguf::TensorInfo* d, merged(m, l, "down", F, D, E));
    for (uint64_t e = 0; e < E; ++e) {
      auto slice = [&](const gguf::TensorInfo* t, uint64_t offset_in_slot, uint64_t rows, uint64_t cols) {
        const uint64_t bytes = t->n_bytes / E;
        return Slice{t->shard, t->file_offset + e * bytes, bytes, t->type, offset_in_slot, static_cast<int64_t>(rows),
                     static_cast<int64_t>(cols)};
      };
      ExpertSlices s;
      s.gate = slice(g, 0, F, D);
      s.up = slice(u, align_up(s.gate.bytes, kSliceAlign), F, D);
      s.down = slice(d, s.up.slot_offset + align_up(s.up.bytes, kSliceAlign), D, F);
      map.slot_bytes_ = std::max(map.slot_bytes_, s.down.slot_offset + align_up(s.down.bytes, kSliceAlign));
      map.expert_bytes_ = std::max(map.expert_bytes_, s.gate.bytes + s.up.bytes + s.down.bytes);
      map.slices_.push_back(s);
    }
  }
  return map;
}

void SliceMap::use_tiles() {
  for (ExpertSlices& e : slices_) {
    for (Slice* s : {&e.gate, &e.up, &e.down}) {
      s->tiles = kernels::tile_layout_exists(kernels::Weight{s->type, s->cols, s->rows, nullptr, s->bytes / s->rows});
    }
  }
}

StatusOr<ExpertSlices> SliceMap::at(uint32_t layer, uint32_t expert) const {
  if (layer >= n_layers_ || expert >= n_experts_) {
    return absl::OutOfRangeError(absl::StrCat("no expert ", expert, " in layer ", layer, " (the model has ", n_layers_,
                                              " layers of ", n_experts_, " experts)"));
  }
  return slices_[static_cast<size_t>(layer) * n_experts_ + expert];
}

}  // namespace dsflash::expertstore
