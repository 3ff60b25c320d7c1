#pragma once
// Hyperparameters of a Qwen2/Llama-style decoder, from a Hugging Face
// config.json or from GGUF keys, validated before any tensor is touched.
#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace llm::weights {

class GgufFile;

enum class Architecture { llama, qwen2 };

// Which elements of a head the rotary embedding rotates together.
//   rotate_half: pairs (i, i + head_dim/2), as Hugging Face checkpoints (and GGUF qwen2) store q/k.
//   interleaved: pairs (2i, 2i + 1), as GGUF llama stores q/k (Meta's layout).
enum class RopeLayout { rotate_half, interleaved };

struct ModelConfig {
  Architecture arch = Architecture::llama;
  int64_t n_embd = 0;         // hidden_size
  int64_t n_layers = 0;       // num_hidden_layers
  int64_t n_heads = 0;        // num_attention_heads
  int64_t n_kv_heads = 0;     // num_key_value_heads (== n_heads for MHA, 1 for MQA)
  int64_t head_dim = 0;       // usually n_embd / n_heads
  int64_t n_ff = 0;           // intermediate_size
  int64_t n_vocab = 0;        // rows of the embedding
  int64_t n_ctx_train = 0;    // max_position_embeddings
  double rope_theta = 10000.0;
  double rms_eps = 1e-6;
  bool tied_embeddings = false;  // LM head reuses the token embedding
  bool qkv_bias = false;         // q/k/v projections have biases (Qwen2)
  RopeLayout rope_layout = RopeLayout::rotate_half;

  // `source` names the file in error messages.
  static ModelConfig from_hf_json(const nlohmann::json& j, const std::string& source);
  static ModelConfig from_gguf(const GgufFile& gguf);
  // Reads and parses a config.json file.
  static ModelConfig from_hf_file(const std::filesystem::path& config_json);

  // Throws std::runtime_error (prefixed with `source`) on any inconsistent value.
  void validate(const std::string& source) const;

  std::string arch_name() const;
  std::string describe() const;  // one line for logs
};

}  // namespace llm::weights
