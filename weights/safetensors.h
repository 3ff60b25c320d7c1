#pragma once
// safetensors reader over a memory map: one file, or a sharded checkpoint
// described by model.safetensors.index.json.
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "weights/mapped_file.h"
#include "weights/tensor.h"

namespace llm::weights {

class SafetensorsFile {
 public:
  // Validates the header: JSON well formed, dtypes known (F32, F16, BF16),
  // offsets inside the data section, byte size == dtype size x shape, no overlaps.
  // Throws std::runtime_error naming the file and the problem.
  explicit SafetensorsFile(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return file_.path(); }
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  MappedFile file_;
  std::vector<TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint directory: model.safetensors, or the shards
// listed in model.safetensors.index.json (every listed tensor must be found
// in the shard the index names).
class SafetensorsModel {
 public:
  explicit SafetensorsModel(const std::filesystem::path& dir);
  static bool present(const std::filesystem::path& dir);

  const TensorView* find(std::string_view name) const;
  const std::map<std::string, const TensorView*, std::less<>>& tensors() const { return by_name_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*, std::less<>> by_name_;
};

}  // namespace llm::weights
