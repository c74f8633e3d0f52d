// GGUF parser. Hostile input is normal: every count, length, type, dimension and offset is
// checked against the bytes that remain in the file before anything is allocated, so a
// corrupt file costs at most memory proportional to its size and always yields a Status
// naming the file, the field and the value.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/gguf/gguf.h"

namespace dsflash::gguf {

namespace {
constexpr uint64_t kMaxNameLen = 1024;       // tensor names (GGML uses 64)
constexpr uint64_t kMaxKeyLen = 65535;       // metadata keys
constexpr int kMaxArrayDepth = 4;            // nested arrays
constexpr uint64_t kMaxAlignment = 1ull << 30;
constexpr size_t kChunk = 1 << 20;
}  // namespace

// Sequential reader over a file with bounded, buffered preads.
class Parser {
 public:
  Parser(File& f) : f_(f) {}

  Status parse();

 private:
  Status fail(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat("GGUF file '", f_.path_, "': ", what));
  }
  uint64_t remaining() const { return f_.file_size_ - pos_; }
  Status need(uint64_t n, const std::string& what) {
    if (n > remaining()) {
      return fail(absl::StrCat("truncated: ", what, " needs ", n, " bytes at offset ", pos_, " but only ",
                               remaining(), " remain"));
    }
    return absl::OkStatus();
  }
  Status read(void* dst, uint64_t n, const std::string& what);
  template <typename T>
  Status read_pod(T* v, const std::string& what) { return read(v, sizeof(T), what); }
  Status read_string(std::string* s, uint64_t max_len, const std::string& what);
  Status read_value(ValueType t, Value* out, const std::string& key, int depth);
  Status parse_tensor_infos(uint64_t n_tensors);
  Status check_tensor_layout();

  File& f_;
  uint64_t pos_ = 0;
  std::vector<uint8_t> buf_;
  uint64_t buf_start_ = 0;
};

Status Parser::read(void* dst, uint64_t n, const std::string& what) {
  RETURN_IF_ERROR(need(n, what));
  auto* out = static_cast<uint8_t*>(dst);
  while (n > 0) {
    if (pos_ < buf_start_ || pos_ >= buf_start_ + buf_.size()) {
      const uint64_t len = std::min<uint64_t>(kChunk, f_.file_size_ - pos_);
      buf_.resize(len);
      RETURN_IF_ERROR(f_.pread(pos_, buf_.data(), len));
      buf_start_ = pos_;
    }
    const uint64_t off = pos_ - buf_start_;
    const uint64_t take = std::min<uint64_t>(n, buf_.size() - off);
    std::memcpy(out, buf_.data() + off, take);
    out += take;
    pos_ += take;
    n -= take;
  }
  return absl::OkStatus();
}

Status Parser::read_string(std::string* s, uint64_t max_len, const std::string& what) {
  uint64_t len = 0;
  RETURN_IF_ERROR(read_pod(&len, what + " length"));
  if (len > max_len) return fail(absl::StrCat(what, ": length ", len, " exceeds the limit of ", max_len));
  RETURN_IF_ERROR(need(len, what));
  s->resize(len);
  return read(s->data(), len, what);
}

Status Parser::read_value(ValueType t, Value* out, const std::string& key, int depth) {
  const std::string where = absl::StrCat("metadata '", key, "'");
  out->type_ = t;
  if (t == ValueType::kString) return read_string(&out->str_, remaining(), where + " string");
  if (t != ValueType::kArray) {
    const size_t sz = scalar_size(t);
    if (sz == 0) return fail(absl::StrCat(where, ": invalid value type ", static_cast<uint32_t>(t)));
    out->bytes_.resize(sz);
    RETURN_IF_ERROR(read(out->bytes_.data(), sz, where));
    if (t == ValueType::kBool && out->bytes_[0] > 1) {
      return fail(absl::StrCat(where, ": bool value ", out->bytes_[0], " is not 0 or 1"));
    }
    return absl::OkStatus();
  }
  if (depth >= kMaxArrayDepth) return fail(absl::StrCat(where, ": arrays nested deeper than ", kMaxArrayDepth));
  uint32_t elem = 0;
  uint64_t n = 0;
  RETURN_IF_ERROR(read_pod(&elem, where + " array type"));
  RETURN_IF_ERROR(read_pod(&n, where + " array length"));
  if (elem > static_cast<uint32_t>(ValueType::kF64)) {
    return fail(absl::StrCat(where, ": invalid array element type ", elem));
  }
  out->elem_ = static_cast<ValueType>(elem);
  // Smallest on-disk size of one element bounds the count by the bytes that remain.
  const uint64_t min_elem = out->elem_ == ValueType::kString ? 8 : out->elem_ == ValueType::kArray ? 12 : scalar_size(out->elem_);
  if (n > remaining() / min_elem) {
    return fail(absl::StrCat(where, ": array length ", n, " cannot fit in the ", remaining(), " bytes that remain"));
  }
  if (out->elem_ == ValueType::kString) {
    out->strs_.resize(n);
    for (uint64_t i = 0; i < n; ++i) {
      RETURN_IF_ERROR(read_string(&out->strs_[i], remaining(), absl::StrCat(where, " element ", i)));
    }
    return absl::OkStatus();
  }
  if (out->elem_ == ValueType::kArray) {
    for (uint64_t i = 0; i < n; ++i) {
      Value v;
      RETURN_IF_ERROR(read_value(ValueType::kArray, &v, key, depth + 1));
      out->nested_.push_back(std::move(v));
    }
    return absl::OkStatus();
  }
  out->bytes_.resize(n * min_elem);
  RETURN_IF_ERROR(read(out->bytes_.data(), out->bytes_.size(), where));
  if (out->elem_ == ValueType::kBool) {
    for (uint64_t i = 0; i < n; ++i) {
      if (out->bytes_[i] > 1) return fail(absl::StrCat(where, ": bool element ", i, " is ", out->bytes_[i]));
    }
  }
  return absl::OkStatus();
}

Status Parser::parse() {
  char magic[4];
  RETURN_IF_ERROR(read(magic, 4, "magic"));
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    return fail(absl::StrCat("bad magic 0x", absl::Hex(*reinterpret_cast<uint32_t*>(magic), absl::kZeroPad8),
                             " (not a GGUF file)"));
  }
  RETURN_IF_ERROR(read_pod(&f_.version_, "version"));
  if (f_.version_ != 2 && f_.version_ != 3) {
    return fail(absl::StrCat("unsupported GGUF version ", f_.version_, " (2 and 3 are supported)"));
  }
  uint64_t n_tensors = 0, n_kv = 0;
  RETURN_IF_ERROR(read_pod(&n_tensors, "tensor count"));
  RETURN_IF_ERROR(read_pod(&n_kv, "metadata count"));
  // A key/value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info
  // 8 + 4 + 8 + 4 + 8 bytes.
  if (n_kv > remaining() / 13) return fail(absl::StrCat("metadata count ", n_kv, " cannot fit in the file"));
  if (n_tensors > remaining() / 32) return fail(absl::StrCat("tensor count ", n_tensors, " cannot fit in the file"));

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    RETURN_IF_ERROR(read_string(&key, kMaxKeyLen, absl::StrCat("metadata key #", i)));
    if (key.empty()) return fail(absl::StrCat("metadata key #", i, " is empty"));
    if (f_.key_index_.count(key)) return fail(absl::StrCat("duplicate metadata key '", key, "'"));
    uint32_t type = 0;
    RETURN_IF_ERROR(read_pod(&type, absl::StrCat("metadata '", key, "' type")));
    if (type > static_cast<uint32_t>(ValueType::kF64)) {
      return fail(absl::StrCat("metadata '", key, "': invalid value type ", type));
    }
    Value v;
    RETURN_IF_ERROR(read_value(static_cast<ValueType>(type), &v, key, 0));
    f_.key_index_.emplace(key, f_.metadata_.size());
    f_.metadata_.emplace_back(std::move(key), std::move(v));
  }

  if (const Value* a = f_.find("general.alignment")) {
    const auto al = a->as_u64();
    if (!al || *al == 0 || (*al & (*al - 1)) != 0 || *al > kMaxAlignment) {
      return fail(absl::StrCat("general.alignment = ", a->to_string(), " is not a power of two in [1, 2^30]"));
    }
    f_.alignment_ = *al;
  }
  RETURN_IF_ERROR(parse_tensor_infos(n_tensors));
  const uint64_t header_end = pos_;
  f_.data_offset_ = (header_end + f_.alignment_ - 1) / f_.alignment_ * f_.alignment_;
  if (!f_.tensors_.empty() && f_.data_offset_ > f_.file_size_) {
    return fail(absl::StrCat("data section starts at ", f_.data_offset_, ", beyond the end of the file (",
                             f_.file_size_, " bytes)"));
  }
  return check_tensor_layout();
}

Status Parser::parse_tensor_infos(uint64_t n_tensors) {
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    RETURN_IF_ERROR(read_string(&t.name, kMaxNameLen, absl::StrCat("tensor #", i, " name")));
    if (t.name.empty()) return fail(absl::StrCat("tensor #", i, " has an empty name"));
    if (f_.tensor_index_.count(t.name)) return fail(absl::StrCat("duplicate tensor name '", t.name, "'"));
    const std::string where = absl::StrCat("tensor '", t.name, "'");
    uint32_t n_dims = 0;
    RETURN_IF_ERROR(read_pod(&n_dims, where + " dimension count"));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return fail(absl::StrCat(where, ": ", n_dims, " dimensions (must be 1..", kMaxDims, ")"));
    }
    t.ne.resize(n_dims);
    t.n_elems = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      RETURN_IF_ERROR(read_pod(&t.ne[d], absl::StrCat(where, " ne[", d, "]")));
      if (t.ne[d] == 0) return fail(absl::StrCat(where, ": ne[", d, "] is 0"));
      if (t.ne[d] > (uint64_t{1} << 62) / t.n_elems) {
        return fail(absl::StrCat(where, ": element count overflows at ne[", d, "] = ", t.ne[d]));
      }
      t.n_elems *= t.ne[d];
    }
    uint32_t type = 0;
    RETURN_IF_ERROR(read_pod(&type, where + " type"));
    const quant::TypeTraits* tr = quant::type_traits(type);
    if (tr == nullptr) return fail(absl::StrCat(where, ": unknown GGML type id ", type));
    t.type = tr->type;
    if (t.ne[0] % tr->block_elems != 0) {
      return fail(absl::StrCat(where, ": row length ne[0] = ", t.ne[0], " is not a multiple of the ", tr->name,
                               " block size ", tr->block_elems));
    }
    t.n_bytes = t.n_elems / tr->block_elems * tr->block_bytes;
    RETURN_IF_ERROR(read_pod(&t.offset, where + " offset"));
    f_.tensor_index_.emplace(t.name, f_.tensors_.size());
    f_.tensors_.push_back(std::move(t));
  }
  return absl::OkStatus();
}

Status Parser::check_tensor_layout() {
  const uint64_t data_bytes = f_.file_size_ - std::min(f_.file_size_, f_.data_offset_);
  std::vector<size_t> order(f_.tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) {
    TensorInfo& t = f_.tensors_[i];
    const std::string where = absl::StrCat("tensor '", t.name, "'");
    if (t.offset % f_.alignment_ != 0) {
      return fail(absl::StrCat(where, ": data offset ", t.offset, " is not aligned to ", f_.alignment_));
    }
    if (t.offset > data_bytes || t.n_bytes > data_bytes - t.offset) {
      return fail(absl::StrCat(where, ": data [", t.offset, ", +", t.n_bytes, ") lies outside the ", data_bytes,
                               "-byte data section"));
    }
    t.file_offset = f_.data_offset_ + t.offset;
    order[i] = i;
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return f_.tensors_[a].offset < f_.tensors_[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorInfo& prev = f_.tensors_[order[k - 1]];
    const TensorInfo& cur = f_.tensors_[order[k]];
    if (prev.offset + prev.n_bytes > cur.offset) {
      return fail(absl::StrCat("tensors '", prev.name, "' and '", cur.name, "' overlap (", prev.offset, "+",
                               prev.n_bytes, " > ", cur.offset, ")"));
    }
  }
  return absl::OkStatus();
}

// ---- File ---------------------------------------------------------------------------------

StatusOr<std::unique_ptr<File>> File::open(const std::string& path, Options options) {
  std::unique_ptr<File> f(new File());
  f->path_ = path;
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f->fd_ < 0) {
    const int err = errno;
    const std::string msg = absl::StrCat("cannot open GGUF file '", path, "': ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::PermissionDeniedError(msg);
  }
  struct stat st;
  if (::fstat(f->fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF file '", path, "' is not a regular file"));
  }
  f->file_size_ = static_cast<uint64_t>(st.st_size);
  Parser parser(*f);
  RETURN_IF_ERROR(parser.parse());
  if (options.map && f->file_size_ > 0) {
    void* m = ::mmap(nullptr, f->file_size_, PROT_READ, MAP_SHARED, f->fd_, 0);
    if (m == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot mmap GGUF file '", path, "': ", std::strerror(errno)));
    }
    f->map_ = static_cast<const uint8_t*>(m);
  }
  return f;
}

File::~File() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), file_size_);
  if (fd_ >= 0) ::close(fd_);
}

const Value* File::find(std::string_view key) const {
  const auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &metadata_[it->second].second;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

StatusOr<const uint8_t*> File::data(const TensorInfo& t) const {
  if (map_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("GGUF file '", path_, "' was opened without mmap"));
  }
  return map_ + t.file_offset;
}

Status File::pread(uint64_t offset, void* dst, size_t n) const {
  if (offset > file_size_ || n > file_size_ - offset) {
    return absl::OutOfRangeError(absl::StrCat("read of ", n, " bytes at ", offset, " is outside '", path_, "' (",
                                              file_size_, " bytes)"));
  }
  auto* out = static_cast<uint8_t*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd_, out, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      return absl::DataLossError(absl::StrCat("pread of '", path_, "' at ", offset, " failed: ",
                                              r == 0 ? "unexpected end of file" : std::strerror(errno)));
    }
    out += r;
    offset += static_cast<uint64_t>(r);
    n -= static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

}  // namespace dsflash::gguf
