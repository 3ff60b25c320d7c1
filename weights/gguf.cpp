#include "weights/gguf.h"

#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace llm::weights {

namespace {

constexpr int k_max_array_depth = 8;

// ggml's tensor type ids, by name, so a file with an unsupported type is
// rejected with a message that names it.
std::string_view ggml_type_name(uint32_t id) {
  switch (id) {
    case 0: return "F32";
    case 1: return "F16";
    case 2: return "Q4_0";
    case 3: return "Q4_1";
    case 6: return "Q5_0";
    case 7: return "Q5_1";
    case 8: return "Q8_0";
    case 9: return "Q8_1";
    case 10: return "Q2_K";
    case 11: return "Q3_K";
    case 12: return "Q4_K";
    case 13: return "Q5_K";
    case 14: return "Q6_K";
    case 15: return "Q8_K";
    case 16: return "IQ2_XXS";
    case 17: return "IQ2_XS";
    case 18: return "IQ3_XXS";
    case 19: return "IQ1_S";
    case 20: return "IQ4_NL";
    case 21: return "IQ3_S";
    case 22: return "IQ2_S";
    case 23: return "IQ4_XS";
    case 24: return "I8";
    case 25: return "I16";
    case 26: return "I32";
    case 27: return "I64";
    case 28: return "F64";
    case 29: return "IQ1_M";
    case 30: return "BF16";
    case 34: return "TQ1_0";
    case 35: return "TQ2_0";
    case 39: return "MXFP4";
    default: return "unknown";
  }
}

std::optional<DType> dtype_from_ggml(uint32_t id) {
  switch (id) {
    case 0: return DType::f32;
    case 1: return DType::f16;
    case 2: return DType::q4_0;
    case 8: return DType::q8_0;
    case 12: return DType::q4_k;
    case 14: return DType::q6_k;
    case 30: return DType::bf16;
    default: return std::nullopt;
  }
}

// Bounds-checked little-endian reader over the mapped file.
class Cursor {
 public:
  Cursor(const MappedFile& file) : file_(file) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return file_.size() - pos_; }

  template <typename T>
  T read() {
    need(sizeof(T), "value");
    T v;
    std::memcpy(&v, file_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string() {
    const uint64_t n = read<uint64_t>();
    need(n, "string");
    std::string s(reinterpret_cast<const char*>(file_.data() + pos_), static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(file_.path().string() + ": invalid GGUF: " + what + " (at byte " +
                             std::to_string(pos_) + ")");
  }

  void need(uint64_t n, const char* what) const {
    if (n > remaining()) fail(std::string("truncated ") + what);
  }

 private:
  const MappedFile& file_;
  size_t pos_ = 0;
};

size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::u8: case GgufType::i8: case GgufType::boolean: return 1;
    case GgufType::u16: case GgufType::i16: return 2;
    case GgufType::u32: case GgufType::i32: case GgufType::f32: return 4;
    case GgufType::u64: case GgufType::i64: case GgufType::f64: return 8;
    case GgufType::string: return 8;  // at least its length prefix
    case GgufType::array: return 12;  // at least type + count
  }
  return 1;
}

GgufValue read_value(Cursor& c, GgufType type, int depth) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufType::u8: v.value = static_cast<uint64_t>(c.read<uint8_t>()); break;
    case GgufType::i8: v.value = static_cast<int64_t>(c.read<int8_t>()); break;
    case GgufType::u16: v.value = static_cast<uint64_t>(c.read<uint16_t>()); break;
    case GgufType::i16: v.value = static_cast<int64_t>(c.read<int16_t>()); break;
    case GgufType::u32: v.value = static_cast<uint64_t>(c.read<uint32_t>()); break;
    case GgufType::i32: v.value = static_cast<int64_t>(c.read<int32_t>()); break;
    case GgufType::u64: v.value = c.read<uint64_t>(); break;
    case GgufType::i64: v.value = c.read<int64_t>(); break;
    case GgufType::f32: v.value = static_cast<double>(c.read<float>()); break;
    case GgufType::f64: v.value = c.read<double>(); break;
    case GgufType::boolean: {
      const uint8_t b = c.read<uint8_t>();
      if (b > 1) c.fail("boolean value " + std::to_string(b));
      v.value = b != 0;
      break;
    }
    case GgufType::string: v.value = c.read_string(); break;
    case GgufType::array: {
      if (depth >= k_max_array_depth) c.fail("arrays nested too deeply");
      const uint32_t elem = c.read<uint32_t>();
      if (elem > static_cast<uint32_t>(GgufType::f64)) c.fail("unknown array element type " + std::to_string(elem));
      v.elem_type = static_cast<GgufType>(elem);
      const uint64_t n = c.read<uint64_t>();
      // Every element takes at least scalar_size bytes: reject absurd counts before allocating.
      if (n > c.remaining() / scalar_size(v.elem_type)) c.fail("array of " + std::to_string(n) + " elements exceeds the file");
      std::vector<GgufValue> items;
      items.reserve(static_cast<size_t>(n));
      for (uint64_t i = 0; i < n; ++i) items.push_back(read_value(c, v.elem_type, depth + 1));
      v.value = std::move(items);
      break;
    }
    default: c.fail("unknown metadata type " + std::to_string(static_cast<uint32_t>(type)));
  }
  return v;
}

}  // namespace

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::u8: return "uint8";
    case GgufType::i8: return "int8";
    case GgufType::u16: return "uint16";
    case GgufType::i16: return "int16";
    case GgufType::u32: return "uint32";
    case GgufType::i32: return "int32";
    case GgufType::f32: return "float32";
    case GgufType::boolean: return "bool";
    case GgufType::string: return "string";
    case GgufType::array: return "array";
    case GgufType::u64: return "uint64";
    case GgufType::i64: return "int64";
    case GgufType::f64: return "float64";
  }
  return "unknown";
}

bool GgufValue::is_integer() const {
  return std::holds_alternative<int64_t>(value) || std::holds_alternative<uint64_t>(value);
}
bool GgufValue::is_number() const { return is_integer() || std::holds_alternative<double>(value); }

std::optional<int64_t> GgufValue::as_int() const {
  if (const auto* i = std::get_if<int64_t>(&value)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&value)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(*u);
  }
  return std::nullopt;
}

std::optional<double> GgufValue::as_double() const {
  if (const auto* d = std::get_if<double>(&value)) return *d;
  if (const auto* i = std::get_if<int64_t>(&value)) return static_cast<double>(*i);
  if (const auto* u = std::get_if<uint64_t>(&value)) return static_cast<double>(*u);
  return std::nullopt;
}

const std::string* GgufValue::as_string() const { return std::get_if<std::string>(&value); }
const std::vector<GgufValue>* GgufValue::as_array() const {
  return std::get_if<std::vector<GgufValue>>(&value);
}

GgufFile::GgufFile(const std::filesystem::path& path) : file_(path) {
  Cursor c(file_);
  if (file_.size() < 4 || std::memcmp(file_.data(), "GGUF", 4) != 0) c.fail("bad magic (not a GGUF file)");
  c.read<uint32_t>();
  version_ = c.read<uint32_t>();
  if (version_ != 2 && version_ != 3) c.fail("unsupported version " + std::to_string(version_) + " (need 2 or 3)");
  const uint64_t n_tensors = c.read<uint64_t>();
  const uint64_t n_kv = c.read<uint64_t>();
  // A key-value pair takes at least 12 bytes, a tensor info at least 24.
  if (n_kv > c.remaining() / 12) c.fail("metadata count " + std::to_string(n_kv) + " exceeds the file");
  if (n_tensors > c.remaining() / 24) c.fail("tensor count " + std::to_string(n_tensors) + " exceeds the file");

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.read_string();
    const uint32_t type = c.read<uint32_t>();
    if (type > static_cast<uint32_t>(GgufType::f64)) c.fail("key '" + key + "' has unknown type " + std::to_string(type));
    GgufValue value = read_value(c, static_cast<GgufType>(type), 0);
    if (!metadata_.emplace(key, std::move(value)).second) c.fail("duplicate key '" + key + "'");
  }

  if (const GgufValue* a = find("general.alignment")) {
    const auto v = a->as_int();
    if (!v || *v <= 0 || (*v & (*v - 1)) != 0 || *v > 1 << 20) c.fail("general.alignment must be a power of two");
    alignment_ = static_cast<size_t>(*v);
  }

  struct RawInfo {
    std::string name;
    std::vector<int64_t> shape;
    uint32_t type;
    uint64_t offset;
  };
  std::vector<RawInfo> infos;
  infos.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    RawInfo info;
    info.name = c.read_string();
    const uint32_t n_dims = c.read<uint32_t>();
    if (n_dims == 0 || n_dims > 4) c.fail("tensor '" + info.name + "' has " + std::to_string(n_dims) + " dims");
    info.shape.resize(n_dims);
    // GGUF lists dims innermost first; store them outermost first.
    int64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = c.read<uint64_t>();
      if (ne == 0 || ne > (uint64_t{1} << 40) ||
          static_cast<uint64_t>(n_elements) > (uint64_t{1} << 50) / ne) {
        c.fail("tensor '" + info.name + "' has an invalid dimension " + std::to_string(ne));
      }
      n_elements *= static_cast<int64_t>(ne);
      info.shape[n_dims - 1 - d] = static_cast<int64_t>(ne);
    }
    info.type = c.read<uint32_t>();
    info.offset = c.read<uint64_t>();
    infos.push_back(std::move(info));
  }

  const size_t data_start = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (n_tensors > 0 && data_start > file_.size()) c.fail("truncated before the tensor data");

  tensors_.reserve(infos.size());
  for (RawInfo& info : infos) {
    const auto dtype = dtype_from_ggml(info.type);
    if (!dtype) {
      c.fail("tensor '" + info.name + "' has type " + std::string(ggml_type_name(info.type)) + " (id " +
             std::to_string(info.type) + "), which is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K)");
    }
    if (info.offset % alignment_ != 0) c.fail("tensor '" + info.name + "' offset is not aligned");
    TensorView t;
    t.name = info.name;
    t.dtype = *dtype;
    t.shape = std::move(info.shape);
    const auto n_bytes = dtype_bytes(*dtype, t.n_cols());
    if (!n_bytes) {
      c.fail("tensor '" + info.name + "' row of " + std::to_string(t.n_cols()) + " is not a whole number of " +
             std::string(dtype_name(*dtype)) + " blocks");
    }
    t.n_bytes = *n_bytes * static_cast<size_t>(t.n_rows());
    if (info.offset > file_.size() - data_start || t.n_bytes > file_.size() - data_start - info.offset) {
      c.fail("tensor '" + info.name + "' data [" + std::to_string(info.offset) + ", +" + std::to_string(t.n_bytes) +
             ") lies outside the file (truncated?)");
    }
    t.data = file_.data() + data_start + info.offset;
    if (!tensor_index_.emplace(t.name, tensors_.size()).second) c.fail("duplicate tensor '" + t.name + "'");
    tensors_.push_back(std::move(t));
  }
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

namespace {
[[noreturn]] void wrong_type(const std::filesystem::path& p, std::string_view key, const GgufValue& v,
                             const char* want) {
  throw std::runtime_error(p.string() + ": GGUF key '" + std::string(key) + "' is " +
                           std::string(gguf_type_name(v.type)) + ", expected " + want);
}
}  // namespace

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (const auto* s = v->as_string()) return *s;
  wrong_type(path(), key, *v, "string");
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (auto i = v->as_int()) return i;
  wrong_type(path(), key, *v, "integer");
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (auto d = v->as_double()) return d;
  wrong_type(path(), key, *v, "number");
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (const auto* b = std::get_if<bool>(&v->value)) return *b;
  wrong_type(path(), key, *v, "bool");
}

std::optional<std::vector<std::string>> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  const auto* items = v->as_array();
  if (items == nullptr || v->elem_type != GgufType::string) wrong_type(path(), key, *v, "array of strings");
  std::vector<std::string> out;
  out.reserve(items->size());
  for (const GgufValue& item : *items) out.push_back(*item.as_string());
  return out;
}

std::optional<std::vector<float>> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  const auto* items = v->as_array();
  if (items == nullptr || v->elem_type == GgufType::string || v->elem_type == GgufType::array ||
      v->elem_type == GgufType::boolean) {
    wrong_type(path(), key, *v, "array of numbers");
  }
  std::vector<float> out;
  out.reserve(items->size());
  for (const GgufValue& item : *items) out.push_back(static_cast<float>(*item.as_double()));
  return out;
}

std::optional<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  const auto* items = v->as_array();
  if (items == nullptr || items->empty() ? (items == nullptr) : !items->front().is_integer()) {
    wrong_type(path(), key, *v, "array of integers");
  }
  std::vector<int64_t> out;
  out.reserve(items->size());
  for (const GgufValue& item : *items) {
    auto i = item.as_int();
    if (!i) wrong_type(path(), key, *v, "array of integers");
    out.push_back(*i);
  }
  return out;
}

const TensorView* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace llm::weights
