// gguf::Value: typed metadata values, conversions and rendering.
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/gguf/gguf.h"
#include "common/check.h"

namespace dsflash::gguf {
namespace {

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

bool is_integer(ValueType t) {
  switch (t) {
    case ValueType::kU8: case ValueType::kI8: case ValueType::kU16: case ValueType::kI16:
    case ValueType::kU32: case ValueType::kI32: case ValueType::kU64: case ValueType::kI64:
      return true;
    default:
      return false;
  }
}

// Raw element at p of type t: integers as (is_signed, bits), floats as double.
struct Num {
  bool is_float;
  bool is_signed;
  uint64_t u;
  int64_t i;
  double f;
};
Num num_at(ValueType t, const uint8_t* p) {
  Num n{false, false, 0, 0, 0.0};
  switch (t) {
    case ValueType::kU8: case ValueType::kBool: n.u = load<uint8_t>(p); break;
    case ValueType::kU16: n.u = load<uint16_t>(p); break;
    case ValueType::kU32: n.u = load<uint32_t>(p); break;
    case ValueType::kU64: n.u = load<uint64_t>(p); break;
    case ValueType::kI8: n.is_signed = true; n.i = load<int8_t>(p); break;
    case ValueType::kI16: n.is_signed = true; n.i = load<int16_t>(p); break;
    case ValueType::kI32: n.is_signed = true; n.i = load<int32_t>(p); break;
    case ValueType::kI64: n.is_signed = true; n.i = load<int64_t>(p); break;
    case ValueType::kF32: n.is_float = true; n.f = load<float>(p); break;
    case ValueType::kF64: n.is_float = true; n.f = load<double>(p); break;
    default: DSF_CHECK(false, "num_at on non-numeric type");
  }
  return n;
}

std::optional<uint64_t> to_u64(const Num& n) {
  if (n.is_float) return std::nullopt;
  if (n.is_signed) return n.i < 0 ? std::nullopt : std::optional<uint64_t>(static_cast<uint64_t>(n.i));
  return n.u;
}
std::optional<int64_t> to_i64(const Num& n) {
  if (n.is_float) return std::nullopt;
  if (n.is_signed) return n.i;
  if (n.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return static_cast<int64_t>(n.u);
}
double to_f64(const Num& n) {
  if (n.is_float) return n.f;
  return n.is_signed ? static_cast<double>(n.i) : static_cast<double>(n.u);
}

std::string render_num(ValueType t, const uint8_t* p) {
  const Num n = num_at(t, p);
  if (t == ValueType::kBool) return n.u ? "true" : "false";
  if (n.is_float) return absl::StrCat(n.f);
  return n.is_signed ? absl::StrCat(n.i) : absl::StrCat(n.u);
}

std::string quoted(const std::string& s, size_t max_len = 120) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < max_len; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\n') out += "\\n";
    else if (c == '"') out += "\\\"";
    else if (c < 0x20) absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    else out += static_cast<char>(c);
  }
  if (s.size() > max_len) out += "...";
  return out + "\"";
}

}  // namespace

const char* value_type_name(ValueType t) {
  static constexpr const char* kNames[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                                "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? kNames[i] : "invalid";
}

size_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::kU8: case ValueType::kI8: case ValueType::kBool: return 1;
    case ValueType::kU16: case ValueType::kI16: return 2;
    case ValueType::kU32: case ValueType::kI32: case ValueType::kF32: return 4;
    case ValueType::kU64: case ValueType::kI64: case ValueType::kF64: return 8;
    default: return 0;
  }
}

Value Value::str(std::string v) {
  Value out;
  out.type_ = ValueType::kString;
  out.str_ = std::move(v);
  return out;
}

Value Value::packed_array(ValueType elem, std::vector<uint8_t> bytes) {
  DSF_CHECK(scalar_size(elem) > 0 && bytes.size() % scalar_size(elem) == 0, "bad packed array");
  Value out;
  out.type_ = ValueType::kArray;
  out.elem_ = elem;
  out.bytes_ = std::move(bytes);
  return out;
}

Value Value::string_array(std::vector<std::string> values) {
  Value out;
  out.type_ = ValueType::kArray;
  out.elem_ = ValueType::kString;
  out.strs_ = std::move(values);
  return out;
}

Value Value::nested_array(ValueType elem, std::vector<Value> values) {
  Value out;
  out.type_ = ValueType::kArray;
  out.elem_ = ValueType::kArray;
  (void)elem;
  out.nested_ = std::move(values);
  return out;
}

size_t Value::size() const {
  if (!is_array()) return 0;
  if (elem_ == ValueType::kString) return strs_.size();
  if (elem_ == ValueType::kArray) return nested_.size();
  return bytes_.size() / scalar_size(elem_);
}

std::optional<uint64_t> Value::as_u64() const {
  if (!is_integer(type_)) return std::nullopt;
  return to_u64(num_at(type_, bytes_.data()));
}
std::optional<int64_t> Value::as_i64() const {
  if (!is_integer(type_)) return std::nullopt;
  return to_i64(num_at(type_, bytes_.data()));
}
std::optional<double> Value::as_f64() const {
  if (scalar_size(type_) == 0 || type_ == ValueType::kBool) return std::nullopt;
  return to_f64(num_at(type_, bytes_.data()));
}
std::optional<bool> Value::as_bool() const {
  if (type_ != ValueType::kBool) return std::nullopt;
  return bytes_[0] != 0;
}

std::optional<int64_t> Value::int_at(size_t i) const {
  if (!is_array() || !is_integer(elem_) || i >= size()) return std::nullopt;
  return to_i64(num_at(elem_, bytes_.data() + i * scalar_size(elem_)));
}
std::optional<uint64_t> Value::u64_at(size_t i) const {
  if (!is_array() || !is_integer(elem_) || i >= size()) return std::nullopt;
  return to_u64(num_at(elem_, bytes_.data() + i * scalar_size(elem_)));
}
std::optional<double> Value::f64_at(size_t i) const {
  if (!is_array() || scalar_size(elem_) == 0 || elem_ == ValueType::kBool || i >= size()) return std::nullopt;
  return to_f64(num_at(elem_, bytes_.data() + i * scalar_size(elem_)));
}

StatusOr<std::vector<int64_t>> Value::ints() const {
  if (!is_array() || !is_integer(elem_)) {
    return absl::InvalidArgumentError(absl::StrCat("expected an integer array, found ", to_string(2)));
  }
  std::vector<int64_t> out(size());
  for (size_t i = 0; i < out.size(); ++i) {
    const auto v = int_at(i);
    if (!v) return absl::OutOfRangeError(absl::StrCat("array element ", i, " does not fit int64"));
    out[i] = *v;
  }
  return out;
}

StatusOr<std::vector<uint64_t>> Value::u64s() const {
  if (!is_array() || !is_integer(elem_)) {
    return absl::InvalidArgumentError(absl::StrCat("expected an integer array, found ", to_string(2)));
  }
  std::vector<uint64_t> out(size());
  for (size_t i = 0; i < out.size(); ++i) {
    const auto v = u64_at(i);
    if (!v) return absl::OutOfRangeError(absl::StrCat("array element ", i, " is negative"));
    out[i] = *v;
  }
  return out;
}

StatusOr<std::vector<float>> Value::floats() const {
  if (!is_array() || scalar_size(elem_) == 0 || elem_ == ValueType::kBool) {
    return absl::InvalidArgumentError(absl::StrCat("expected a numeric array, found ", to_string(2)));
  }
  std::vector<float> out(size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(*f64_at(i));
  return out;
}

std::string Value::to_string(size_t max_elems) const {
  if (type_ == ValueType::kString) return quoted(str_);
  if (!is_array()) return render_num(type_, bytes_.data());
  std::string out = absl::StrCat("array[", value_type_name(elem_), "; ", size(), "] [");
  const size_t n = std::min(size(), max_elems);
  for (size_t i = 0; i < n; ++i) {
    if (i) out += ", ";
    if (elem_ == ValueType::kString) out += quoted(strs_[i], 40);
    else if (elem_ == ValueType::kArray) out += nested_[i].to_string(max_elems);
    else out += render_num(elem_, bytes_.data() + i * scalar_size(elem_));
  }
  if (size() > n) out += ", ...";
  return out + "]";
}

std::string TensorInfo::shape_string() const { return absl::StrCat("[", absl::StrJoin(ne, ", "), "]"); }

}  // namespace dsflash::gguf
