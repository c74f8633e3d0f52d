// gguf::Writer: GGUF v3 output, one file or a gguf-split set. Tensor bytes come from fill
// callbacks, one tensor buffered at a time, so that models larger than memory can be written.
#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/gguf/gguf.h"

namespace dsflash::gguf {
namespace {

class Out {
 public:
  explicit Out(std::FILE* f) : f_(f) {}
  void bytes(const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f_) != n) ok_ = false;
    pos_ += n;
  }
  template <typename T> void pod(T v) { bytes(&v, sizeof(T)); }
  void str(const std::string& s) {
    pod<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad_to(uint64_t alignment) {
    static const uint8_t kZeros[4096] = {};
    while (pos_ % alignment) bytes(kZeros, std::min<uint64_t>(alignment - pos_ % alignment, sizeof(kZeros)));
  }
  void value(const Value& v) {
    if (v.type() == ValueType::kString) return str(*v.as_string());
    if (!v.is_array()) return bytes(v.packed_bytes().data(), v.packed_bytes().size());
    pod<uint32_t>(static_cast<uint32_t>(v.elem_type()));
    pod<uint64_t>(v.size());
    if (v.elem_type() == ValueType::kString) {
      for (const auto& s : v.strings()) str(s);
    } else if (v.elem_type() == ValueType::kArray) {
      for (const auto& e : v.elems()) value(e);
    } else {
      bytes(v.packed_bytes().data(), v.packed_bytes().size());
    }
  }
  uint64_t pos() const { return pos_; }
  bool ok() const { return ok_; }

 private:
  std::FILE* f_;
  uint64_t pos_ = 0;
  bool ok_ = true;
};

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

void Writer::set(const std::string& key, Value v) {
  for (auto& [k, old] : kv_) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  kv_.emplace_back(key, std::move(v));
}

Status Writer::add_tensor(const std::string& name, std::vector<uint64_t> ne, quant::GgmlType type, Fill fill) {
  if (ne.empty() || ne.size() > static_cast<size_t>(kMaxDims)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", ne.size(), " dimensions"));
  }
  for (const auto& t : tensors_) {
    if (t.name == name) return absl::AlreadyExistsError(absl::StrCat("tensor '", name, "' added twice"));
  }
  uint64_t n = 1;
  for (uint64_t d : ne) {
    if (d == 0) return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has a zero dimension"));
    n *= d;
  }
  if (ne[0] % quant::traits(type).block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ne[0] = ", ne[0], " is not a multiple of the ",
                                                   quant::traits(type).name, " block"));
  }
  ASSIGN_OR_RETURN(const uint64_t bytes, quant::row_bytes(type, n));
  tensors_.push_back(Pending{name, std::move(ne), type, bytes, std::move(fill)});
  return absl::OkStatus();
}

Status Writer::add_tensor_f32(const std::string& name, std::vector<uint64_t> ne, quant::GgmlType type,
                              std::vector<float> values) {
  auto shared = std::make_shared<std::vector<float>>(std::move(values));
  uint64_t n = 1;
  for (uint64_t d : ne) n *= d;
  if (n != shared->size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", shared->size(), " values for ", n, " elements"));
  }
  return add_tensor(name, std::move(ne), type, [shared, type](uint8_t* dst, uint64_t) {
    return quant::encode_row(type, shared->data(), dst, static_cast<int64_t>(shared->size()));
  });
}

Status Writer::write_file(const std::string& path, const Metadata& kv, size_t first, size_t last) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot create '", path, "'"));
  Out out(f.get());
  out.bytes("GGUF", 4);
  out.pod<uint32_t>(3);
  out.pod<uint64_t>(last - first);
  out.pod<uint64_t>(kv.size());
  for (const auto& [k, v] : kv) {
    out.str(k);
    out.pod<uint32_t>(static_cast<uint32_t>(v.type()));
    out.value(v);
  }
  uint64_t offset = 0;
  for (size_t i = first; i < last; ++i) {
    const Pending& t = tensors_[i];
    out.str(t.name);
    out.pod<uint32_t>(static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) out.pod<uint64_t>(d);
    out.pod<uint32_t>(static_cast<uint32_t>(t.type));
    out.pod<uint64_t>(offset);
    offset = align_up(offset + t.n_bytes, alignment_);
  }
  out.pad_to(alignment_);
  std::vector<uint8_t> buf;
  for (size_t i = first; i < last; ++i) {
    const Pending& t = tensors_[i];
    buf.assign(t.n_bytes, 0);
    const Status s = t.fill(buf.data(), t.n_bytes);
    if (!s.ok()) return Status(s.code(), absl::StrCat("tensor '", t.name, "': ", s.message()));
    out.bytes(buf.data(), buf.size());
    out.pad_to(alignment_);
    done_bytes_ += t.n_bytes;
    if (progress_) progress_(done_bytes_, total_bytes_);
  }
  if (!out.ok() || std::fflush(f.get()) != 0) {
    return absl::DataLossError(absl::StrCat("write to '", path, "' failed (disk full?)"));
  }
  return absl::OkStatus();
}

Status Writer::write(const std::string& path) {
  Metadata kv = kv_;
  if (alignment_ != kDefaultAlignment) {
    bool have = false;
    for (auto& [k, v] : kv) have |= k == "general.alignment";
    if (!have) kv.emplace_back("general.alignment", Value::u32(static_cast<uint32_t>(alignment_)));
  }
  done_bytes_ = 0;
  total_bytes_ = 0;
  for (const auto& t : tensors_) total_bytes_ += t.n_bytes;
  return write_file(path, kv, 0, tensors_.size());
}

StatusOr<std::vector<std::string>> Writer::write_split(const std::string& prefix, uint32_t n_shards) {
  if (n_shards == 0 || n_shards > 65535 || n_shards > std::max<size_t>(tensors_.size(), 1)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot split ", tensors_.size(), " tensors into ", n_shards, " shards"));
  }
  done_bytes_ = 0;
  total_bytes_ = 0;
  for (const auto& t : tensors_) total_bytes_ += t.n_bytes;
  // Greedy contiguous split: shard k ends once the running total passes k/n of all bytes,
  // leaving at least one tensor for every later shard.
  std::vector<size_t> bounds = {0};
  uint64_t acc = 0;
  for (size_t i = 0; i < tensors_.size() && bounds.size() < n_shards; ++i) {
    acc += tensors_[i].n_bytes;
    const size_t left_tensors = tensors_.size() - (i + 1);
    const size_t left_shards = n_shards - bounds.size();
    if ((acc * n_shards >= total_bytes_ * bounds.size() && left_tensors >= left_shards) || left_tensors == left_shards) {
      bounds.push_back(i + 1);
    }
  }
  bounds.push_back(tensors_.size());
  std::vector<std::string> paths;
  for (uint32_t s = 0; s < n_shards; ++s) {
    Metadata kv;
    if (s == 0) kv = kv_;
    bool has_alignment = false;
    for (const auto& [k, v] : kv) has_alignment |= k == "general.alignment";
    if (alignment_ != kDefaultAlignment && !has_alignment) {
      kv.emplace_back("general.alignment", Value::u32(static_cast<uint32_t>(alignment_)));
    }
    for (auto it = kv.begin(); it != kv.end();) {
      it = it->first.rfind("split.", 0) == 0 ? kv.erase(it) : it + 1;
    }
    kv.emplace_back("split.no", Value::u16(static_cast<uint16_t>(s)));
    kv.emplace_back("split.count", Value::u16(static_cast<uint16_t>(n_shards)));
    kv.emplace_back("split.tensors.count", Value::i32(static_cast<int32_t>(tensors_.size())));
    const std::string p = split_path(prefix, s + 1, n_shards);
    RETURN_IF_ERROR(write_file(p, kv, bounds[s], bounds[s + 1]));
    paths.push_back(p);
  }
  return paths;
}

}  // namespace dsflash::gguf
