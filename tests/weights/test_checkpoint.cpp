// Checkpoint: one view of HF directories and GGUF files, configs from both, shapes validated.
#include <doctest/doctest.h>

#include "fixtures.h"
#include "weights/checkpoint.h"
#include "weights/gguf.h"
#include "weights/model_config.h"

using namespace llm::weights;
using namespace llm::test;

namespace {
void check_same_hparams(const ModelConfig& a, const ModelConfig& b) {
  CHECK(a.arch == b.arch);
  CHECK(a.n_embd == b.n_embd);
  CHECK(a.n_layers == b.n_layers);
  CHECK(a.n_heads == b.n_heads);
  CHECK(a.n_kv_heads == b.n_kv_heads);
  CHECK(a.head_dim == b.head_dim);
  CHECK(a.n_ff == b.n_ff);
  CHECK(a.n_vocab == b.n_vocab);
  CHECK(a.n_ctx_train == b.n_ctx_train);
  CHECK(a.rope_theta == doctest::Approx(b.rope_theta));
  CHECK(a.rms_eps == doctest::Approx(b.rms_eps));
  CHECK(a.tied_embeddings == b.tied_embeddings);
  CHECK(a.qkv_bias == b.qkv_bias);
}
}  // namespace

TEST_CASE("stories260K: HF directory and GGUF give the same hyperparameters") {
  Checkpoint hf(model_path("stories260K"));
  Checkpoint gg(model_path("stories260K/stories260K-f32.gguf"));
  CHECK(hf.format() == CheckpointFormat::safetensors);
  CHECK(gg.format() == CheckpointFormat::gguf);
  const ModelConfig& c = hf.config();
  CHECK(c.arch == Architecture::llama);
  CHECK(c.n_embd == 64);
  CHECK(c.n_layers == 5);
  CHECK(c.n_heads == 8);
  CHECK(c.n_kv_heads == 4);
  CHECK(c.head_dim == 8);
  CHECK(c.n_ff == 172);
  CHECK(c.n_vocab == 512);
  CHECK(c.n_ctx_train == 512);
  CHECK(c.tied_embeddings);
  CHECK_FALSE(c.qkv_bias);
  check_same_hparams(hf.config(), gg.config());
  // HF checkpoints rotate halves; llama GGUF stores q/k permuted for interleaved pairs.
  CHECK(hf.config().rope_layout == RopeLayout::rotate_half);
  CHECK(gg.config().rope_layout == RopeLayout::interleaved);
  CHECK(hf.tensor("model.layers.4.mlp.up_proj.weight").to_f32() ==
        gg.tensor("model.layers.4.mlp.up_proj.weight").to_f32());
  CHECK(hf.default_name() == "stories260K");
  CHECK(gg.default_name() == "stories260K-f32");
}

TEST_CASE("tiny-qwen2: safetensors, f32 GGUF and Q8_0 GGUF agree on the config") {
  Checkpoint hf(model_path("tiny-qwen2"));
  Checkpoint f32(model_path("tiny-qwen2/tiny-qwen2-f32.gguf"));
  Checkpoint q8(model_path("tiny-qwen2/tiny-qwen2-q8_0.gguf"));
  const ModelConfig& c = hf.config();
  CHECK(c.arch == Architecture::qwen2);
  CHECK(c.qkv_bias);
  CHECK(c.tied_embeddings);
  CHECK(c.rope_theta == 1e6);
  CHECK(c.rms_eps == doctest::Approx(1e-6));
  CHECK(c.head_dim == 16);
  CHECK(c.n_vocab == 151936);
  check_same_hparams(c, f32.config());
  check_same_hparams(c, q8.config());
  CHECK(f32.config().rope_layout == RopeLayout::rotate_half);  // GGUF qwen2 keeps HF's layout
  CHECK(q8.tensor("model.layers.0.self_attn.q_proj.weight").dtype == DType::q8_0);
  CHECK(q8.find("lm_head.weight") == nullptr);
}

TEST_CASE("real Qwen2.5 configs parse") {
  for (const char* name : {"qwen2.5-0.5b-instruct", "qwen2.5-1.5b-instruct", "qwen2.5-7b-instruct"}) {
    CAPTURE(name);
    const auto j = nlohmann::json::parse(read_file(model_path("configs") / name / "config.json"));
    const ModelConfig c = ModelConfig::from_hf_json(j, name);
    CHECK(c.arch == Architecture::qwen2);
    CHECK(c.qkv_bias);
    CHECK(c.n_vocab >= 151936);
    CHECK(c.n_embd / c.n_heads == c.head_dim);
  }
  const auto j = nlohmann::json::parse(read_file(model_path("configs/qwen2.5-0.5b-instruct/config.json")));
  const ModelConfig c = ModelConfig::from_hf_json(j, "0.5b");
  CHECK(c.n_embd == 896);
  CHECK(c.n_layers == 24);
  CHECK(c.n_heads == 14);
  CHECK(c.n_kv_heads == 2);
  CHECK(c.n_ff == 4864);
  CHECK(c.tied_embeddings);
}

TEST_CASE("GGUF and HF tensor names map both ways") {
  CHECK(gguf_to_hf_name("blk.12.attn_q.bias") == "model.layers.12.self_attn.q_proj.bias");
  CHECK(gguf_to_hf_name("token_embd.weight") == "model.embed_tokens.weight");
  CHECK(gguf_to_hf_name("output.weight") == "lm_head.weight");
  CHECK(gguf_to_hf_name("blk.x.attn_q.bias").empty());
  CHECK(gguf_to_hf_name("rope_freqs.weight").empty());
  CHECK(hf_to_gguf_name("model.layers.3.mlp.down_proj.weight") == "blk.3.ffn_down.weight");
  CHECK(hf_to_gguf_name("model.layers.3.post_attention_layernorm.weight") == "blk.3.ffn_norm.weight");
  CHECK(hf_to_gguf_name("model.norm.weight") == "output_norm.weight");
}

TEST_CASE("config validation names the problem") {
  auto base = nlohmann::json::parse(read_file(model_path("stories260K/config.json")));
  auto expect_error = [&](const std::function<void(nlohmann::json&)>& edit, const char* text) {
    nlohmann::json j = base;
    edit(j);
    CHECK_THROWS_WITH(ModelConfig::from_hf_json(j, "cfg.json"), doctest::Contains(text));
  };
  expect_error([](auto& j) { j["model_type"] = "gpt_neox"; }, "model_type \"gpt_neox\" is not supported");
  expect_error([](auto& j) { j.erase("hidden_size"); }, "missing \"hidden_size\"");
  expect_error([](auto& j) { j["hidden_size"] = "64"; }, "\"hidden_size\" must be an integer");
  expect_error([](auto& j) { j["num_key_value_heads"] = 3; }, "must be a multiple of KV heads");
  expect_error([](auto& j) { j["num_hidden_layers"] = 0; }, "layer count = 0 is out of range");
  expect_error([](auto& j) { j["rms_norm_eps"] = -1; }, "rms_norm_eps");
  expect_error([](auto& j) { j["rope_scaling"] = {{"type", "yarn"}}; }, "rope_scaling");
  expect_error([](auto& j) { j["hidden_act"] = "gelu"; }, "hidden_act");
}
