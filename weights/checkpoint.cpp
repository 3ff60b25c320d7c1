#include "weights/checkpoint.h"

#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "weights/chat_template.h"
#include "weights/gguf.h"
#include "weights/safetensors.h"
#include "weights/tokenizer.h"

namespace llm::weights {

namespace {

// Per-layer tensors: GGUF suffix <-> Hugging Face suffix.
constexpr std::array<std::pair<std::string_view, std::string_view>, 13> k_layer_names = {{
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"attn_output.bias", "self_attn.o_proj.bias"},
}};
constexpr std::array<std::pair<std::string_view, std::string_view>, 3> k_global_names = {{
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
}};

// Splits "<prefix><layer>.<rest>" into layer and rest.
bool split_layer(std::string_view name, std::string_view prefix, std::string& layer, std::string_view& rest) {
  if (name.substr(0, prefix.size()) != prefix) return false;
  name.remove_prefix(prefix.size());
  const size_t dot = name.find('.');
  if (dot == 0 || dot == std::string_view::npos) return false;
  for (char ch : name.substr(0, dot)) {
    if (ch < '0' || ch > '9') return false;
  }
  layer = std::string(name.substr(0, dot));
  rest = name.substr(dot + 1);
  return true;
}


}  // namespace

std::string gguf_to_hf_name(std::string_view name) {
  for (const auto& [g, h] : k_global_names) {
    if (name == g) return std::string(h);
  }
  std::string layer;
  std::string_view rest;
  if (!split_layer(name, "blk.", layer, rest)) return {};
  for (const auto& [g, h] : k_layer_names) {
    if (rest == g) return "model.layers." + layer + "." + std::string(h);
  }
  return {};
}

std::string hf_to_gguf_name(std::string_view name) {
  for (const auto& [g, h] : k_global_names) {
    if (name == h) return std::string(g);
  }
  std::string layer;
  std::string_view rest;
  if (!split_layer(name, "model.layers.", layer, rest)) return {};
  for (const auto& [g, h] : k_layer_names) {
    if (rest == h) return "blk." + layer + "." + std::string(g);
  }
  return {};
}

Checkpoint::Checkpoint(const std::filesystem::path& path) : path_(path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) {
    format_ = CheckpointFormat::safetensors;
    const fs::path config_path = path / "config.json";
    if (!fs::is_regular_file(config_path)) {
      throw std::runtime_error(path.string() + ": not a model directory (no config.json)");
    }
    config_ = ModelConfig::from_hf_file(config_path);
    if (!SafetensorsModel::present(path)) {
      throw std::runtime_error(path.string() + ": no model.safetensors or model.safetensors.index.json");
    }
    safetensors_ = std::make_unique<SafetensorsModel>(path);
  } else if (fs::is_regular_file(path)) {
    format_ = CheckpointFormat::gguf;
    gguf_ = std::make_unique<GgufFile>(path);
    config_ = ModelConfig::from_gguf(*gguf_);
  } else {
    throw std::runtime_error(path.string() + ": no such model directory or GGUF file");
  }
  check_shapes();
}

Checkpoint::~Checkpoint() = default;
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;

Checkpoint Checkpoint::dummy(const ModelConfig& config, DType dtype, uint64_t seed) {
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16) {
    throw std::invalid_argument("dummy weights can be f32, bf16 or f16, not " + std::string(dtype_name(dtype)));
  }
  config.validate("dummy config");
  Checkpoint ck;
  ck.path_ = "dummy";
  ck.format_ = CheckpointFormat::dummy;
  ck.config_ = config;
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  // Uniform in [-scale, scale] with scale 1/sqrt(fan_in) keeps activations in
  // a normal range through all layers (no overflow, no denormals).
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool ones) {
    TensorView t;
    t.name = name;
    t.dtype = dtype;
    t.shape = std::move(shape);
    const int64_t n = t.n_elements();
    t.n_bytes = *dtype_bytes(dtype, n);
    HugeBuffer buffer(t.n_bytes);
    std::byte* data = buffer.data();
    const float scale = 1.0f / std::sqrt(static_cast<float>(t.n_cols()));
    for (int64_t i = 0; i < n; ++i) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      const float u = static_cast<float>(state >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
      const float v = ones ? 1.0f : u * scale;
      if (dtype == DType::f32) {
        std::memcpy(data + 4 * i, &v, 4);
      } else {
        const uint16_t h = dtype == DType::bf16 ? f32_to_bf16(v) : f32_to_f16(v);
        std::memcpy(data + 2 * i, &h, 2);
      }
    }
    t.data = data;
    ck.owned_data_.push_back(std::move(buffer));
    ck.owned_views_.emplace(t.name, std::move(t));
  };
  const ModelConfig& c = config;
  const int64_t q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  add("model.embed_tokens.weight", {c.n_vocab, c.n_embd}, false);
  add("model.norm.weight", {c.n_embd}, true);
  if (!c.tied_embeddings) add("lm_head.weight", {c.n_vocab, c.n_embd}, false);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {c.n_embd}, true);
    add(p + "self_attn.q_proj.weight", {q_dim, c.n_embd}, false);
    add(p + "self_attn.k_proj.weight", {kv_dim, c.n_embd}, false);
    add(p + "self_attn.v_proj.weight", {kv_dim, c.n_embd}, false);
    if (c.qkv_bias) {
      add(p + "self_attn.q_proj.bias", {q_dim}, false);
      add(p + "self_attn.k_proj.bias", {kv_dim}, false);
      add(p + "self_attn.v_proj.bias", {kv_dim}, false);
    }
    add(p + "self_attn.o_proj.weight", {c.n_embd, q_dim}, false);
    add(p + "post_attention_layernorm.weight", {c.n_embd}, true);
    add(p + "mlp.gate_proj.weight", {c.n_ff, c.n_embd}, false);
    add(p + "mlp.up_proj.weight", {c.n_ff, c.n_embd}, false);
    add(p + "mlp.down_proj.weight", {c.n_embd, c.n_ff}, false);
  }
  ck.check_shapes();
  return ck;
}

const TensorView* Checkpoint::find(std::string_view hf_name) const {
  if (format_ == CheckpointFormat::dummy) {
    auto it = owned_views_.find(hf_name);
    return it == owned_views_.end() ? nullptr : &it->second;
  }
  if (safetensors_) return safetensors_->find(hf_name);
  const std::string g = hf_to_gguf_name(hf_name);
  return g.empty() ? nullptr : gguf_->find_tensor(g);
}

const TensorView& Checkpoint::tensor(std::string_view hf_name) const {
  if (const TensorView* t = find(hf_name)) return *t;
  std::string name(hf_name);
  if (gguf_) name = hf_to_gguf_name(hf_name) + " (" + name + ")";
  throw std::runtime_error(path_.string() + ": missing tensor " + name);
}

void Checkpoint::check_shapes() const {
  const ModelConfig& c = config_;
  auto expect = [&](const std::string& name, std::vector<int64_t> shape, bool required = true) {
    const TensorView* t = find(name);
    if (t == nullptr) {
      if (required) tensor(name);  // throws with the format's own name
      return;
    }
    if (t->shape != shape) {
      throw std::runtime_error(path_.string() + ": tensor " + name + " has shape " + shape_string(t->shape) +
                               ", config expects " + shape_string(shape));
    }
  };
  const int64_t q_dim = c.n_heads * c.head_dim;
  const int64_t kv_dim = c.n_kv_heads * c.head_dim;
  const TensorView& embd = tensor("model.embed_tokens.weight");
  if (embd.shape.size() != 2 || embd.shape[0] != c.n_vocab) {
    throw std::runtime_error(path_.string() + ": vocab size mismatch: token embedding has shape " +
                             shape_string(embd.shape) + " but the config says vocab " + std::to_string(c.n_vocab));
  }
  expect("model.embed_tokens.weight", {c.n_vocab, c.n_embd});
  expect("model.norm.weight", {c.n_embd});
  if (c.tied_embeddings) {
    if (find("lm_head.weight") != nullptr && gguf_ == nullptr) {
      // HF checkpoints sometimes store the tied head anyway; it must then match.
      expect("lm_head.weight", {c.n_vocab, c.n_embd});
    }
  } else {
    expect("lm_head.weight", {c.n_vocab, c.n_embd});
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    expect(p + "input_layernorm.weight", {c.n_embd});
    expect(p + "self_attn.q_proj.weight", {q_dim, c.n_embd});
    expect(p + "self_attn.k_proj.weight", {kv_dim, c.n_embd});
    expect(p + "self_attn.v_proj.weight", {kv_dim, c.n_embd});
    if (c.qkv_bias) {
      expect(p + "self_attn.q_proj.bias", {q_dim});
      expect(p + "self_attn.k_proj.bias", {kv_dim});
      expect(p + "self_attn.v_proj.bias", {kv_dim});
    }
    expect(p + "self_attn.o_proj.weight", {c.n_embd, q_dim});
    expect(p + "post_attention_layernorm.weight", {c.n_embd});
    expect(p + "mlp.gate_proj.weight", {c.n_ff, c.n_embd});
    expect(p + "mlp.up_proj.weight", {c.n_ff, c.n_embd});
    expect(p + "mlp.down_proj.weight", {c.n_embd, c.n_ff});
  }
}

Tokenizer Checkpoint::load_tokenizer() const {
  if (format_ == CheckpointFormat::dummy) throw std::runtime_error("a dummy checkpoint has no tokenizer");
  Tokenizer tok = gguf_ ? Tokenizer::from_gguf(*gguf_) : Tokenizer::from_hf_dir(path_);
  if (tok.n_vocab() > config_.n_vocab) {
    throw std::runtime_error(path_.string() + ": vocab size mismatch: the tokenizer has " +
                             std::to_string(tok.n_vocab()) + " tokens but the model embeds only " +
                             std::to_string(config_.n_vocab));
  }
  return tok;
}

ChatTemplate Checkpoint::load_chat_template(const Tokenizer& tokenizer) const {
  if (format_ == CheckpointFormat::dummy) return ChatTemplate::fallback();
  if (gguf_) return ChatTemplate::from_gguf(*gguf_, tokenizer.bos_text(), tokenizer.eos_text());
  return ChatTemplate::from_hf_dir(path_, tokenizer.bos_text(), tokenizer.eos_text());
}

std::string Checkpoint::default_name() const {
  std::filesystem::path p = path_;
  if (!p.has_filename()) p = p.parent_path();  // trailing slash
  return format_ == CheckpointFormat::gguf ? p.stem().string() : p.filename().string();
}

}  // namespace llm::weights
