#include "weights/gguf_writer.h"

#include <cstring>
#include <fstream>
#include <stdexcept>

namespace llm::weights {

namespace {

constexpr size_t k_alignment = 32;

uint32_t ggml_type_id(DType t) {
  switch (t) {
    case DType::f32: return 0;
    case DType::f16: return 1;
    case DType::q4_0: return 2;
    case DType::q8_0: return 8;
    case DType::q4_k: return 12;
    case DType::q6_k: return 14;
    case DType::bf16: return 30;
  }
  return 0;
}

class Buffer {
 public:
  template <typename T>
  void put(T v) {
    append(&v, sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    append(s.data(), s.size());
  }
  void append(const void* p, size_t n) {
    // resize + memcpy rather than insert: GCC 12 warns falsely on the latter.
    const size_t at = bytes.size();
    bytes.resize(at + n);
    if (n > 0) std::memcpy(bytes.data() + at, p, n);
  }
  void pad_to(size_t alignment) { bytes.resize((bytes.size() + alignment - 1) / alignment * alignment); }
  std::vector<std::byte> bytes;
};

void put_value(Buffer& b, const GgufValue& v) {
  switch (v.type) {
    case GgufType::u8: b.put<uint8_t>(static_cast<uint8_t>(std::get<uint64_t>(v.value))); break;
    case GgufType::i8: b.put<int8_t>(static_cast<int8_t>(std::get<int64_t>(v.value))); break;
    case GgufType::u16: b.put<uint16_t>(static_cast<uint16_t>(std::get<uint64_t>(v.value))); break;
    case GgufType::i16: b.put<int16_t>(static_cast<int16_t>(std::get<int64_t>(v.value))); break;
    case GgufType::u32: b.put<uint32_t>(static_cast<uint32_t>(std::get<uint64_t>(v.value))); break;
    case GgufType::i32: b.put<int32_t>(static_cast<int32_t>(std::get<int64_t>(v.value))); break;
    case GgufType::u64: b.put<uint64_t>(std::get<uint64_t>(v.value)); break;
    case GgufType::i64: b.put<int64_t>(std::get<int64_t>(v.value)); break;
    case GgufType::f32: b.put<float>(static_cast<float>(std::get<double>(v.value))); break;
    case GgufType::f64: b.put<double>(std::get<double>(v.value)); break;
    case GgufType::boolean: b.put<uint8_t>(std::get<bool>(v.value) ? 1 : 0); break;
    case GgufType::string: b.put_string(std::get<std::string>(v.value)); break;
    case GgufType::array: {
      const auto& items = std::get<std::vector<GgufValue>>(v.value);
      b.put<uint32_t>(static_cast<uint32_t>(v.elem_type));
      b.put<uint64_t>(items.size());
      for (const GgufValue& item : items) put_value(b, item);
      break;
    }
  }
}

}  // namespace

void GgufWriter::set(std::string key, GgufValue value) {
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(std::move(key), std::move(value));
}

void GgufWriter::set_string(std::string key, std::string v) {
  set(std::move(key), GgufValue{GgufType::string, GgufType::u8, std::move(v)});
}
void GgufWriter::set_u32(std::string key, uint32_t v) {
  set(std::move(key), GgufValue{GgufType::u32, GgufType::u8, uint64_t{v}});
}
void GgufWriter::set_f32(std::string key, float v) {
  set(std::move(key), GgufValue{GgufType::f32, GgufType::u8, double{v}});
}
void GgufWriter::set_bool(std::string key, bool v) { set(std::move(key), GgufValue{GgufType::boolean, GgufType::u8, v}); }
void GgufWriter::set_string_array(std::string key, const std::vector<std::string>& v) {
  std::vector<GgufValue> items;
  items.reserve(v.size());
  for (const std::string& s : v) items.push_back(GgufValue{GgufType::string, GgufType::u8, s});
  set(std::move(key), GgufValue{GgufType::array, GgufType::string, std::move(items)});
}

void GgufWriter::add_tensor(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<std::byte> data) {
  tensors_.push_back(Tensor{std::move(name), dtype, std::move(shape), std::move(data)});
}

std::vector<std::byte> GgufWriter::serialize() const {
  Buffer b;
  b.put<uint32_t>(0x46554747);  // "GGUF"
  b.put<uint32_t>(3);
  b.put<uint64_t>(tensors_.size());
  b.put<uint64_t>(metadata_.size());
  for (const auto& [k, v] : metadata_) {
    b.put_string(k);
    b.put<uint32_t>(static_cast<uint32_t>(v.type));
    put_value(b, v);
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    b.put_string(t.name);
    b.put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) b.put<uint64_t>(static_cast<uint64_t>(*it));
    b.put<uint32_t>(ggml_type_id(t.dtype));
    b.put<uint64_t>(offset);
    offset += (t.data.size() + k_alignment - 1) / k_alignment * k_alignment;
  }
  b.pad_to(k_alignment);
  for (const Tensor& t : tensors_) {
    b.append(t.data.data(), t.data.size());
    b.pad_to(k_alignment);
  }
  return b.bytes;
}

void GgufWriter::write(const std::filesystem::path& path) const {
  const std::vector<std::byte> bytes = serialize();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw std::runtime_error(path.string() + ": cannot write GGUF file");
}

}  // namespace llm::weights
