#pragma once
// Writes GGUF v3 files: metadata plus tensors. Used by the quantizer and by
// tests that need small or deliberately broken files.
#include <filesystem>
#include <string>
#include <vector>

#include "weights/gguf.h"

namespace llm::weights {

class GgufWriter {
 public:
  void set(std::string key, GgufValue value);
  void set_string(std::string key, std::string v);
  void set_u32(std::string key, uint32_t v);
  void set_f32(std::string key, float v);
  void set_bool(std::string key, bool v);
  void set_string_array(std::string key, const std::vector<std::string>& v);

  // shape outermost first (PyTorch order); data holds the stored bytes.
  void add_tensor(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<std::byte> data);

  // The complete file as bytes, and written to a path (throws on I/O error).
  std::vector<std::byte> serialize() const;
  void write(const std::filesystem::path& path) const;

 private:
  struct Tensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<std::byte> data;
  };
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<Tensor> tensors_;
};

}  // namespace llm::weights
