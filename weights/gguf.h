#pragma once
// GGUF (v2/v3) reader over a memory map: metadata of every value type
// (including nested arrays), tensor infos, alignment.
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "weights/mapped_file.h"
#include "weights/tensor.h"

namespace llm::weights {

enum class GgufType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
  string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
};
std::string_view gguf_type_name(GgufType t);

struct GgufValue {
  GgufType type = GgufType::u8;
  GgufType elem_type = GgufType::u8;  // arrays only
  // Integers widen to int64/uint64 and floats to double; type keeps the stored kind.
  std::variant<bool, int64_t, uint64_t, double, std::string, std::vector<GgufValue>> value;

  bool is_integer() const;
  bool is_number() const;  // integer or float
  std::optional<int64_t> as_int() const;  // nullopt if not an integer or out of int64 range
  std::optional<double> as_double() const;
  const std::string* as_string() const;
  const std::vector<GgufValue>* as_array() const;
};

class GgufFile {
 public:
  // Throws std::runtime_error naming the file and the problem (bad magic,
  // unsupported version, truncated data, tensor outside the file, unknown type...).
  explicit GgufFile(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return file_.path(); }
  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }

  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;  // any numeric type
  std::optional<bool> get_bool(std::string_view key) const;
  // Typed arrays; throw if the key exists with another type.
  std::optional<std::vector<std::string>> get_string_array(std::string_view key) const;
  std::optional<std::vector<float>> get_float_array(std::string_view key) const;
  std::optional<std::vector<int64_t>> get_int_array(std::string_view key) const;

  // Tensors in file order; shapes in PyTorch order (outermost first).
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* find_tensor(std::string_view name) const;

 private:
  MappedFile file_;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace llm::weights
