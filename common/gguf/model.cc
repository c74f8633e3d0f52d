// gguf::Model: one file or a complete gguf-split set, tensors looked up by name across shards.
#include <cstdio>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/gguf/gguf.h"

namespace dsflash::gguf {

std::string split_path(const std::string& prefix, uint32_t no, uint32_t count) {
  return absl::StrFormat("%s-%05d-of-%05d.gguf", prefix, no, count);
}

std::optional<std::tuple<std::string, uint32_t, uint32_t>> parse_split_path(const std::string& path) {
  static const std::regex kPattern(R"(^(.*)-([0-9]{5})-of-([0-9]{5})\.gguf$)");
  std::smatch m;
  if (!std::regex_match(path, m, kPattern)) return std::nullopt;
  return std::make_tuple(m[1].str(), static_cast<uint32_t>(std::stoul(m[2].str())),
                         static_cast<uint32_t>(std::stoul(m[3].str())));
}

namespace {

// Reads an integer split key of shard `f`; error names the shard and key.
StatusOr<uint64_t> split_key(const File& f, const char* key) {
  const Value* v = f.find(key);
  if (v == nullptr) return absl::InvalidArgumentError(absl::StrCat("shard '", f.path(), "' lacks '", key, "'"));
  const auto u = v->as_u64();
  if (!u) return absl::InvalidArgumentError(absl::StrCat("shard '", f.path(), "': '", key, "' = ", v->to_string(), " is not a non-negative integer"));
  return *u;
}

}  // namespace

StatusOr<std::unique_ptr<Model>> Model::open(const std::string& path, File::Options options) {
  auto model = std::make_unique<Model>();
  const auto split = parse_split_path(path);
  if (!split) {
    ASSIGN_OR_RETURN(auto f, File::open(path, options));
    if (const Value* c = f->find("split.count"); c && c->as_u64().value_or(1) > 1) {
      return absl::InvalidArgumentError(absl::StrCat("GGUF file '", path, "' is shard ",
                                                     f->find("split.no") ? f->find("split.no")->to_string() : "?",
                                                     " of a ", c->to_string(),
                                                     "-shard set but its name does not follow <prefix>-0000k-of-0000n.gguf"));
    }
    model->shards_.push_back(std::move(f));
  } else {
    const auto& [prefix, no, count] = *split;
    if (count == 0 || no == 0 || no > count) {
      return absl::InvalidArgumentError(absl::StrCat("'", path, "': shard number ", no, " of ", count, " is invalid"));
    }
    for (uint32_t i = 1; i <= count; ++i) {
      const std::string p = split_path(prefix, i, count);
      auto f = File::open(p, options);
      if (!f.ok()) {
        if (absl::IsNotFound(f.status())) {
          return absl::NotFoundError(absl::StrCat("shard ", i, " of ", count, " is missing: ", f.status().message()));
        }
        return f.status();
      }
      ASSIGN_OR_RETURN(const uint64_t sno, split_key(**f, "split.no"));
      ASSIGN_OR_RETURN(const uint64_t scount, split_key(**f, "split.count"));
      if (sno != i - 1 || scount != count) {
        return absl::InvalidArgumentError(absl::StrCat("shard '", p, "' says it is split.no ", sno, " of split.count ",
                                                       scount, "; its name says ", i - 1, " of ", count));
      }
      model->shards_.push_back(std::move(*f));
    }
  }
  for (uint32_t s = 0; s < model->shards_.size(); ++s) {
    for (TensorInfo t : model->shards_[s]->tensors()) {
      if (model->tensor_index_.count(t.name)) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' appears in more than one shard (again in '",
                                                       model->shards_[s]->path(), "')"));
      }
      t.shard = s;
      model->tensor_index_.emplace(t.name, model->tensors_.size());
      model->tensors_.push_back(std::move(t));
    }
  }
  if (model->shards_.size() > 1 || model->find("split.tensors.count")) {
    ASSIGN_OR_RETURN(const uint64_t total, split_key(*model->shards_[0], "split.tensors.count"));
    if (total != model->tensors_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("split set '", path, "': split.tensors.count is ", total,
                                                     " but the shards hold ", model->tensors_.size(), " tensors"));
    }
  }
  return model;
}

const TensorInfo* Model::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

uint64_t Model::total_bytes() const {
  uint64_t n = 0;
  for (const auto& s : shards_) n += s->file_size();
  return n;
}

StatusOr<std::string> Model::fingerprint(std::string_view name_part) const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  auto mix = [&h](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
  };
  std::vector<uint8_t> head;
  for (const TensorInfo& t : tensors_) {
    if (t.name.find(name_part) == std::string::npos) continue;
    mix(t.name.data(), t.name.size());
    const uint32_t type = static_cast<uint32_t>(t.type);
    mix(&type, sizeof(type));
    mix(t.ne.data(), t.ne.size() * sizeof(t.ne[0]));
    head.resize(static_cast<size_t>(std::min<uint64_t>(4096, t.n_bytes)));
    RETURN_IF_ERROR(read(t, 0, head.data(), head.size()));
    mix(head.data(), head.size());
  }
  return absl::StrFormat("%016x", h);
}

Status Model::read(const TensorInfo& t, uint64_t offset, void* dst, size_t n) const {
  if (offset > t.n_bytes || n > t.n_bytes - offset) {
    return absl::OutOfRangeError(absl::StrCat("read of ", n, " bytes at ", offset, " is outside tensor '", t.name,
                                              "' (", t.n_bytes, " bytes)"));
  }
  return shards_[t.shard]->pread(t.file_offset + offset, dst, n);
}

}  // namespace dsflash::gguf
