#pragma once
// Builders for small model files in tests: safetensors from tensors, and a
// Hugging Face directory made from the stories260K checkpoint with edits.
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "weights/dtype.h"
#include "weights/safetensors.h"

namespace llm::test {

struct RawTensor {
  std::string dtype;  // "F32", "BF16", ...
  std::vector<int64_t> shape;
  std::string bytes;
};

// Serialises tensors in the safetensors layout; header_edit may rewrite the
// header JSON first (to make a file that lies).
inline std::string make_safetensors(const std::map<std::string, RawTensor>& tensors,
                                    const std::function<void(nlohmann::json&)>& header_edit = {}) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  if (header_edit) header_edit(header);
  const std::string h = header.dump();
  const uint64_t n = h.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + h + data;
}

inline std::string f32_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// Copies stories260K (f32 safetensors + config + tokenizer) into dir, letting
// the caller drop/replace tensors and edit config.json.
inline void make_stories_dir(const std::filesystem::path& dir,
                             const std::function<void(std::map<std::string, RawTensor>&)>& tensor_edit = {},
                             const std::function<void(nlohmann::json&)>& config_edit = {}) {
  const auto src = model_path("stories260K");
  weights::SafetensorsFile st(src / "model.safetensors");
  std::map<std::string, RawTensor> tensors;
  for (const auto& t : st.tensors()) {
    tensors[t.name] = RawTensor{"F32", t.shape, std::string(reinterpret_cast<const char*>(t.data), t.n_bytes)};
  }
  if (tensor_edit) tensor_edit(tensors);
  write_file(dir / "model.safetensors", make_safetensors(tensors));
  nlohmann::json config = nlohmann::json::parse(read_file(src / "config.json"));
  if (config_edit) config_edit(config);
  write_file(dir / "config.json", config.dump(1));
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"}) {
    write_file(dir / f, read_file(src / f));
  }
}

}  // namespace llm::test
