#pragma once
// A model on disk as the engine sees it: a Hugging Face directory
// (config.json + safetensors + tokenizer files) or a single GGUF file.
// Tensors are looked up by their Hugging Face names whatever the format, and
// every tensor's shape is checked against the config when the checkpoint opens.
#include <filesystem>
#include <map>
#include <memory>
#include <vector>
#include <string>
#include <string_view>

#include "weights/huge_buffer.h"
#include "weights/model_config.h"
#include "weights/tensor.h"

namespace llm::weights {

class GgufFile;
class SafetensorsModel;
class Tokenizer;
class ChatTemplate;

enum class CheckpointFormat { safetensors, gguf, dummy };

class Checkpoint {
 public:
  // path: a directory in Hugging Face layout, or a .gguf file. Throws
  // std::runtime_error naming the file and the problem.
  explicit Checkpoint(const std::filesystem::path& path);
  // Random weights of the shapes `config` describes, held in memory (vLLM's
  // "dummy" load format): real model shapes can be benchmarked without the
  // weights. dtype is f32, bf16 or f16. There is no tokenizer.
  static Checkpoint dummy(const ModelConfig& config, DType dtype = DType::f32, uint64_t seed = 1);
  ~Checkpoint();
  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;

  const std::filesystem::path& path() const { return path_; }
  CheckpointFormat format() const { return format_; }
  const ModelConfig& config() const { return config_; }
  const GgufFile* gguf() const { return gguf_.get(); }

  // Hugging Face names, e.g. "model.layers.3.self_attn.q_proj.weight".
  const TensorView* find(std::string_view hf_name) const;
  const TensorView& tensor(std::string_view hf_name) const;  // throws naming the file

  // The tokenizer and chat template shipped with the model. A tokenizer whose
  // ids exceed the embedding is rejected.
  Tokenizer load_tokenizer() const;
  ChatTemplate load_chat_template(const Tokenizer& tokenizer) const;

  // Name the model goes by when none is given: the directory or file stem.
  std::string default_name() const;

 private:
  Checkpoint() = default;
  void check_shapes() const;
  std::filesystem::path path_;
  CheckpointFormat format_ = CheckpointFormat::safetensors;
  ModelConfig config_;
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<SafetensorsModel> safetensors_;
  // Dummy checkpoints own their tensors.
  std::map<std::string, TensorView, std::less<>> owned_views_;
  std::vector<HugeBuffer> owned_data_;
};

// GGUF tensor name -> Hugging Face name ("blk.3.attn_q.weight" ->
// "model.layers.3.self_attn.q_proj.weight"); empty if the name is not one of ours.
std::string gguf_to_hf_name(std::string_view gguf_name);
std::string hf_to_gguf_name(std::string_view hf_name);

}  // namespace llm::weights
