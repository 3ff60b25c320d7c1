#include "weights/model_config.h"

#include <cmath>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "weights/gguf.h"

namespace llm::weights {

namespace {

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw std::runtime_error(source + ": " + what);
}

int64_t json_int(const nlohmann::json& j, const char* key, const std::string& source, std::optional<int64_t> def = {}) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (def) return *def;
    fail(source, std::string("missing \"") + key + "\"");
  }
  if (!it->is_number_integer()) fail(source, std::string("\"") + key + "\" must be an integer");
  return it->get<int64_t>();
}

double json_num(const nlohmann::json& j, const char* key, const std::string& source, double def) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_number()) fail(source, std::string("\"") + key + "\" must be a number");
  return it->get<double>();
}

bool json_bool(const nlohmann::json& j, const char* key, const std::string& source, bool def) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_boolean()) fail(source, std::string("\"") + key + "\" must be true or false");
  return it->get<bool>();
}

}  // namespace

ModelConfig ModelConfig::from_hf_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) fail(source, "config is not a JSON object");
  ModelConfig c;
  const std::string model_type = j.value("model_type", "");
  if (model_type == "qwen2") {
    c.arch = Architecture::qwen2;
  } else if (model_type == "llama" || model_type == "mistral") {
    c.arch = Architecture::llama;
  } else {
    fail(source, "model_type \"" + model_type + "\" is not supported (qwen2, llama, mistral)");
  }
  c.n_embd = json_int(j, "hidden_size", source);
  c.n_layers = json_int(j, "num_hidden_layers", source);
  c.n_heads = json_int(j, "num_attention_heads", source);
  c.n_kv_heads = json_int(j, "num_key_value_heads", source, c.n_heads);
  c.head_dim = json_int(j, "head_dim", source, c.n_heads > 0 ? c.n_embd / c.n_heads : 0);
  c.n_ff = json_int(j, "intermediate_size", source);
  c.n_vocab = json_int(j, "vocab_size", source);
  c.n_ctx_train = json_int(j, "max_position_embeddings", source, 2048);
  c.rope_theta = json_num(j, "rope_theta", source, 10000.0);
  c.rms_eps = json_num(j, "rms_norm_eps", source, 1e-6);
  c.tied_embeddings = json_bool(j, "tie_word_embeddings", source, false);
  // Qwen2 always has q/k/v biases; Llama has them only with attention_bias.
  c.qkv_bias = c.arch == Architecture::qwen2 || json_bool(j, "attention_bias", source, false);
  c.rope_layout = RopeLayout::rotate_half;

  const std::string act = j.value("hidden_act", "silu");
  if (act != "silu") fail(source, "hidden_act \"" + act + "\" is not supported (silu)");
  if (json_bool(j, "mlp_bias", source, false)) fail(source, "mlp_bias is not supported");
  if (const auto rs = j.find("rope_scaling"); rs != j.end() && !rs->is_null()) {
    fail(source, "rope_scaling " + rs->dump() + " is not supported");
  }
  if (json_bool(j, "use_sliding_window", source, false)) {
    fail(source, "use_sliding_window is not supported");
  }
  c.validate(source);
  return c;
}

ModelConfig ModelConfig::from_hf_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) fail(path.string(), "cannot open");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail(path.string(), std::string("not valid JSON: ") + e.what());
  }
  return from_hf_json(j, path.string());
}

ModelConfig ModelConfig::from_gguf(const GgufFile& g) {
  const std::string source = g.path().string();
  const auto arch = g.get_string("general.architecture");
  if (!arch) fail(source, "missing general.architecture");
  ModelConfig c;
  if (*arch == "qwen2") {
    c.arch = Architecture::qwen2;
    c.rope_layout = RopeLayout::rotate_half;
  } else if (*arch == "llama") {
    c.arch = Architecture::llama;
    c.rope_layout = RopeLayout::interleaved;  // llama.cpp's converter permutes q/k to Meta's layout
  } else {
    fail(source, "architecture \"" + *arch + "\" is not supported (qwen2, llama)");
  }
  const std::string p = *arch + ".";
  auto need = [&](const std::string& key) {
    const auto v = g.get_int(p + key);
    if (!v) fail(source, "missing " + p + key);
    return *v;
  };
  c.n_embd = need("embedding_length");
  c.n_layers = need("block_count");
  c.n_heads = need("attention.head_count");
  c.n_kv_heads = g.get_int(p + "attention.head_count_kv").value_or(c.n_heads);
  c.head_dim = g.get_int(p + "attention.key_length").value_or(c.n_heads > 0 ? c.n_embd / c.n_heads : 0);
  if (const auto vl = g.get_int(p + "attention.value_length"); vl && *vl != c.head_dim) {
    fail(source, "attention.value_length differs from key_length, which is not supported");
  }
  if (const auto rd = g.get_int(p + "rope.dimension_count"); rd && *rd != c.head_dim) {
    fail(source, "partial rotary (rope.dimension_count " + std::to_string(*rd) + " != head_dim) is not supported");
  }
  c.n_ff = need("feed_forward_length");
  c.n_ctx_train = need("context_length");
  c.rope_theta = g.get_float(p + "rope.freq_base").value_or(10000.0);
  const auto eps = g.get_float(p + "attention.layer_norm_rms_epsilon");
  if (!eps) fail(source, "missing " + p + "attention.layer_norm_rms_epsilon");
  c.rms_eps = *eps;
  if (const auto scaling = g.get_string(p + "rope.scaling.type"); scaling && *scaling != "none") {
    fail(source, "rope scaling \"" + *scaling + "\" is not supported");
  }

  const TensorView* embd = g.find_tensor("token_embd.weight");
  if (embd == nullptr) fail(source, "missing tensor token_embd.weight");
  c.n_vocab = g.get_int(p + "vocab_size").value_or(embd->shape.front());
  c.tied_embeddings = g.find_tensor("output.weight") == nullptr;
  c.qkv_bias = g.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.validate(source);
  return c;
}

void ModelConfig::validate(const std::string& source) const {
  auto positive = [&](int64_t v, const char* what, int64_t max) {
    if (v <= 0 || v > max) fail(source, std::string(what) + " = " + std::to_string(v) + " is out of range");
  };
  positive(n_embd, "hidden size", 1 << 17);
  positive(n_layers, "layer count", 1024);
  positive(n_heads, "attention head count", 1024);
  positive(n_kv_heads, "KV head count", 1024);
  positive(head_dim, "head_dim", 1024);
  positive(n_ff, "intermediate size", 1 << 20);
  positive(n_vocab, "vocab size", 1 << 22);
  positive(n_ctx_train, "context length", 1 << 24);
  if (n_heads % n_kv_heads != 0) {
    fail(source, "attention heads (" + std::to_string(n_heads) + ") must be a multiple of KV heads (" +
                     std::to_string(n_kv_heads) + ")");
  }
  if (head_dim % 2 != 0) fail(source, "head_dim " + std::to_string(head_dim) + " must be even for rotary embeddings");
  if (!(rope_theta > 0.0) || !std::isfinite(rope_theta)) fail(source, "rope_theta must be positive");
  if (!(rms_eps > 0.0) || rms_eps > 1.0) fail(source, "rms_norm_eps must be in (0, 1]");
}

std::string ModelConfig::arch_name() const { return arch == Architecture::qwen2 ? "qwen2" : "llama"; }

std::string ModelConfig::describe() const {
  return arch_name() + ": " + std::to_string(n_layers) + " layers, hidden " + std::to_string(n_embd) + ", heads " +
         std::to_string(n_heads) + "/" + std::to_string(n_kv_heads) + " (head_dim " + std::to_string(head_dim) +
         "), ffn " + std::to_string(n_ff) + ", vocab " + std::to_string(n_vocab) + ", ctx " +
         std::to_string(n_ctx_train) + ", rope_theta " + std::to_string(rope_theta) +
         (tied_embeddings ? ", tied embeddings" : "") + (qkv_bias ? ", qkv bias" : "");
}

}  // namespace llm::weights
