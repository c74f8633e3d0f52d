// GGUF v2/v3 files and split sets: typed metadata values, a hostile-input-safe reader
// (mmap and pread access), shard sets (`<prefix>-0000k-of-0000n.gguf`) with tensors looked up
// by name across shards, and a writer (single file or N shards) used by tools and tests.
// Does not interpret model semantics (common/config does). Readers are immutable after open
// and safe to share between threads; the writer is single-threaded.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/quant/quant.h"
#include "common/status.h"

namespace dsflash::gguf {

inline constexpr uint64_t kDefaultAlignment = 32;
inline constexpr int kMaxDims = 4;

// GGUF metadata value types (on-disk ids).
enum class ValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
const char* value_type_name(ValueType t);
// Byte size of a fixed-size scalar type; 0 for string and array.
size_t scalar_size(ValueType t);

// One metadata value: a scalar, a string, or an array (of scalars, strings or arrays).
// Numeric arrays are stored packed (little-endian bytes) so that 129k-entry token maps stay small.
class Value {
 public:
  Value() = default;
  // ---- construction
  template <typename T> static Value scalar(ValueType t, T v);
  static Value u8(uint8_t v) { return scalar(ValueType::kU8, v); }
  static Value i8(int8_t v) { return scalar(ValueType::kI8, v); }
  static Value u16(uint16_t v) { return scalar(ValueType::kU16, v); }
  static Value i16(int16_t v) { return scalar(ValueType::kI16, v); }
  static Value u32(uint32_t v) { return scalar(ValueType::kU32, v); }
  static Value i32(int32_t v) { return scalar(ValueType::kI32, v); }
  static Value u64(uint64_t v) { return scalar(ValueType::kU64, v); }
  static Value i64(int64_t v) { return scalar(ValueType::kI64, v); }
  static Value f32(float v) { return scalar(ValueType::kF32, v); }
  static Value f64(double v) { return scalar(ValueType::kF64, v); }
  static Value boolean(bool v) { return scalar(ValueType::kBool, static_cast<uint8_t>(v ? 1 : 0)); }
  static Value str(std::string v);
  // Packed numeric array of `elem` (any fixed-size type) from raw little-endian bytes.
  static Value packed_array(ValueType elem, std::vector<uint8_t> bytes);
  template <typename T> static Value array(ValueType elem, const std::vector<T>& values);
  static Value string_array(std::vector<std::string> values);
  static Value nested_array(ValueType elem, std::vector<Value> values);

  // ---- inspection
  ValueType type() const { return type_; }
  bool is_array() const { return type_ == ValueType::kArray; }
  ValueType elem_type() const { return elem_; }  // arrays only
  size_t size() const;                           // array length (0 for scalars)

  // Scalars (any integer type, value in range), else nullopt.
  std::optional<uint64_t> as_u64() const;
  std::optional<int64_t> as_i64() const;
  // Any numeric scalar as double / float.
  std::optional<double> as_f64() const;
  std::optional<bool> as_bool() const;
  const std::string* as_string() const { return type_ == ValueType::kString ? &str_ : nullptr; }

  // Element i of a numeric array as integer / double (nullopt if not representable).
  std::optional<int64_t> int_at(size_t i) const;
  std::optional<uint64_t> u64_at(size_t i) const;
  std::optional<double> f64_at(size_t i) const;
  // Whole numeric arrays; errors name the element that does not fit.
  StatusOr<std::vector<int64_t>> ints() const;
  StatusOr<std::vector<uint64_t>> u64s() const;
  StatusOr<std::vector<float>> floats() const;
  const std::vector<std::string>& strings() const { return strs_; }  // string arrays
  const std::vector<Value>& elems() const { return nested_; }         // arrays of arrays
  const std::vector<uint8_t>& packed_bytes() const { return bytes_; }

  // Human-readable rendering; arrays show at most `max_elems` elements.
  std::string to_string(size_t max_elems = 8) const;

 private:
  ValueType type_ = ValueType::kU8;
  ValueType elem_ = ValueType::kU8;
  std::vector<uint8_t> bytes_;  // scalar bytes, or packed numeric array
  std::string str_;
  std::vector<std::string> strs_;
  std::vector<Value> nested_;
  friend class Parser;
};

using Metadata = std::vector<std::pair<std::string, Value>>;

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // ggml order: ne[0] is contiguous
  quant::GgmlType type = quant::GgmlType::kF32;
  uint64_t offset = 0;       // relative to the data section of its file
  uint64_t n_elems = 0;
  uint64_t n_bytes = 0;
  uint64_t file_offset = 0;  // absolute offset in its file
  uint32_t shard = 0;        // index in the shard set (0 for a single file)

  uint64_t rows() const { return n_elems / ne[0]; }
  std::string shape_string() const;  // "[256, 512]"
};

// One GGUF file, parsed and validated; data accessible by mmap pointer and by pread.
class File {
 public:
  struct Options {
    bool map = true;  // mmap the whole file read-only (else pread only)
  };
  // Opens and validates `path`. Every problem is an error naming the file, field and value.
  static StatusOr<std::unique_ptr<File>> open(const std::string& path, Options options);
  static StatusOr<std::unique_ptr<File>> open(const std::string& path) { return open(path, Options{}); }
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return file_size_; }
  const Metadata& metadata() const { return metadata_; }
  const Value* find(std::string_view key) const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;

  // Pointer to a tensor's bytes in the mapping (FailedPrecondition when opened without map).
  StatusOr<const uint8_t*> data(const TensorInfo& t) const;
  // Reads n bytes at absolute file offset `offset` (bounds-checked, retries short reads).
  Status pread(uint64_t offset, void* dst, size_t n) const;
  int fd() const { return fd_; }

 private:
  File() = default;
  friend class Parser;
  std::string path_;
  int fd_ = -1;
  const uint8_t* map_ = nullptr;
  uint64_t file_size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  Metadata metadata_;
  std::map<std::string, size_t, std::less<>> key_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// A model: one GGUF file or a complete split set. Metadata comes from the first shard.
class Model {
 public:
  // Opens `path`; if its name matches `<prefix>-%05d-of-%05d.gguf`, finds and checks every
  // shard of the set (split.no / split.count / split.tensors.count, no duplicate tensors).
  static StatusOr<std::unique_ptr<Model>> open(const std::string& path, File::Options options);
  static StatusOr<std::unique_ptr<Model>> open(const std::string& path) { return open(path, File::Options{}); }

  size_t n_shards() const { return shards_.size(); }
  const File& shard(size_t i) const { return *shards_[i]; }
  const std::string& path() const { return shards_[0]->path(); }
  const Metadata& metadata() const { return shards_[0]->metadata(); }
  const Value* find(std::string_view key) const { return shards_[0]->find(key); }
  // All tensors of all shards, in shard then file order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  uint64_t total_bytes() const;
  // A 64-bit hex fingerprint of the tensors whose names contain `name_part`: names, types,
  // shapes and the first 4 KiB of their data. Two processes opening the same GGUF agree;
  // a different model, quantisation or seed differs.
  StatusOr<std::string> fingerprint(std::string_view name_part) const;

  StatusOr<const uint8_t*> data(const TensorInfo& t) const { return shards_[t.shard]->data(t); }
  // Reads n bytes starting `offset` bytes into tensor t.
  Status read(const TensorInfo& t, uint64_t offset, void* dst, size_t n) const;

 private:
  std::vector<std::unique_ptr<File>> shards_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Split-set file name helpers: "m-00002-of-00007.gguf".
std::string split_path(const std::string& prefix, uint32_t no, uint32_t count);
// If `path` names a shard, returns {prefix, no (1-based), count}.
std::optional<std::tuple<std::string, uint32_t, uint32_t>> parse_split_path(const std::string& path);

// Writes GGUF v3 files. Tensor data are produced on demand by a fill callback so that models
// larger than memory can be written one tensor at a time.
class Writer {
 public:
  using Fill = std::function<Status(uint8_t* dst, uint64_t n_bytes)>;
  using Progress = std::function<void(uint64_t done_bytes, uint64_t total_bytes)>;

  explicit Writer(uint64_t alignment = kDefaultAlignment) : alignment_(alignment) {}
  // Sets (or replaces) a key; keys are written in first-set order.
  void set(const std::string& key, Value v);
  // Adds a tensor whose bytes `fill` writes (exactly row_bytes(type, n_elems) bytes).
  Status add_tensor(const std::string& name, std::vector<uint64_t> ne, quant::GgmlType type, Fill fill);
  // Adds a tensor from fp32 values, encoded to `type`.
  Status add_tensor_f32(const std::string& name, std::vector<uint64_t> ne, quant::GgmlType type,
                        std::vector<float> values);
  void set_progress(Progress p) { progress_ = std::move(p); }
  size_t n_tensors() const { return tensors_.size(); }
  uint64_t total_tensor_bytes() const {
    uint64_t n = 0;
    for (const auto& t : tensors_) n += t.n_bytes;
    return n;
  }

  // Writes one file.
  Status write(const std::string& path);
  // Writes `n_shards` files `<prefix>-0000k-of-0000n.gguf`, tensors split in order into
  // shards of roughly equal bytes; all metadata in shard 1, split.* keys in every shard.
  // Returns the paths written.
  StatusOr<std::vector<std::string>> write_split(const std::string& prefix, uint32_t n_shards);

 private:
  struct Pending {
    std::string name;
    std::vector<uint64_t> ne;
    quant::GgmlType type;
    uint64_t n_bytes;
    Fill fill;
  };
  Status write_file(const std::string& path, const Metadata& kv, size_t first, size_t last);
  uint64_t alignment_;
  Metadata kv_;
  std::vector<Pending> tensors_;
  Progress progress_;
  uint64_t done_bytes_ = 0;
  uint64_t total_bytes_ = 0;
};

// ---- template definitions ---------------------------------------------------------------
template <typename T>
Value Value::scalar(ValueType t, T v) {
  Value out;
  out.type_ = t;
  out.bytes_.resize(sizeof(T));
  std::memcpy(out.bytes_.data(), &v, sizeof(T));
  return out;
}

template <typename T>
Value Value::array(ValueType elem, const std::vector<T>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return packed_array(elem, std::move(bytes));
}

}  // namespace dsflash::gguf
