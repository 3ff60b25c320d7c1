// GGUF reader on the real test files, and the writer round trip.
#include <doctest/doctest.h>

#include <cmath>

#include "test_util.h"
#include "weights/gguf.h"
#include "weights/gguf_writer.h"
#include "weights/safetensors.h"

using namespace llm::weights;
using llm::test::model_path;

TEST_CASE("stories260K GGUF: metadata and tensor infos") {
  GgufFile g(model_path("stories260K/stories260K-f32.gguf"));
  CHECK(g.version() == 3);
  CHECK(g.get_string("general.architecture") == "llama");
  CHECK(g.get_int("llama.block_count") == 5);
  CHECK(g.get_int("llama.attention.head_count_kv") == 4);
  CHECK(g.get_float("llama.attention.layer_norm_rms_epsilon").value() == doctest::Approx(1e-5));
  CHECK(g.get_bool("tokenizer.ggml.add_bos_token") == true);
  const auto tokens = g.get_string_array("tokenizer.ggml.tokens");
  REQUIRE(tokens.has_value());
  CHECK(tokens->size() == 512);
  CHECK(tokens->at(1) == "<s>");
  CHECK(g.get_float_array("tokenizer.ggml.scores")->size() == 512);
  CHECK(g.get_int_array("tokenizer.ggml.token_type")->size() == 512);
  CHECK_FALSE(g.get_string("no.such.key").has_value());
  CHECK_THROWS_WITH_AS(g.get_string("llama.block_count"), doctest::Contains("expected string"), std::runtime_error);

  CHECK(g.tensors().size() == 47);
  const TensorView* embd = g.find_tensor("token_embd.weight");
  REQUIRE(embd != nullptr);
  CHECK(embd->dtype == DType::f32);
  CHECK(embd->shape == std::vector<int64_t>{512, 64});  // GGUF ne = {64, 512}, reversed
  CHECK(g.find_tensor("blk.4.ffn_down.weight")->shape == std::vector<int64_t>{64, 172});
  for (const TensorView& t : g.tensors()) {
    CHECK(reinterpret_cast<uintptr_t>(t.data) % g.alignment() == 0);
  }
}

TEST_CASE("stories260K: GGUF tensors equal the safetensors ones (q/k in Meta's interleaved order)") {
  GgufFile g(model_path("stories260K/stories260K-f32.gguf"));
  SafetensorsFile st(model_path("stories260K/model.safetensors"));
  std::map<std::string, const TensorView*> hf;
  for (const TensorView& t : st.tensors()) hf[t.name] = &t;
  const int64_t head_dim = 8;

  const auto embd_g = g.find_tensor("token_embd.weight")->to_f32();
  const auto embd_h = hf.at("model.embed_tokens.weight")->to_f32();
  CHECK(embd_g == embd_h);
  for (int l = 0; l < 5; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    const std::string p = "model.layers." + std::to_string(l) + ".";
    CHECK(g.find_tensor(b + "ffn_down.weight")->to_f32() == hf.at(p + "mlp.down_proj.weight")->to_f32());
    CHECK(g.find_tensor(b + "attn_v.weight")->to_f32() == hf.at(p + "self_attn.v_proj.weight")->to_f32());
    CHECK(g.find_tensor(b + "attn_norm.weight")->to_f32() == hf.at(p + "input_layernorm.weight")->to_f32());
    // llama.cpp's converter permutes q/k rows per head: HF row (half * hd/2 + i) -> GGUF row (2i + half).
    for (const auto& [gn, hn, n_heads] : {std::tuple{"attn_q.weight", "self_attn.q_proj.weight", 8},
                                          std::tuple{"attn_k.weight", "self_attn.k_proj.weight", 4}}) {
      const TensorView* tg = g.find_tensor(b + gn);
      const auto wg = tg->to_f32();
      const auto wh = hf.at(p + hn)->to_f32();
      const int64_t cols = tg->n_cols();
      bool same = true;
      for (int h = 0; h < n_heads; ++h) {
        for (int half = 0; half < 2; ++half) {
          for (int i = 0; i < head_dim / 2; ++i) {
            const int64_t rg = h * head_dim + 2 * i + half;
            const int64_t rh = h * head_dim + half * head_dim / 2 + i;
            for (int64_t c = 0; c < cols; ++c) same = same && wg[rg * cols + c] == wh[rh * cols + c];
          }
        }
      }
      const std::string what = b + gn;
      CHECK_MESSAGE(same, what);
    }
  }
}

TEST_CASE("tiny-qwen2: bf16 safetensors and f32 GGUF are bit-identical; Q8_0 within its block scale") {
  SafetensorsFile st(model_path("tiny-qwen2/model.safetensors"));
  GgufFile f32(model_path("tiny-qwen2/tiny-qwen2-f32.gguf"));
  GgufFile q8(model_path("tiny-qwen2/tiny-qwen2-q8_0.gguf"));
  std::map<std::string, std::string> names = {{"model.embed_tokens.weight", "token_embd.weight"},
                                              {"model.norm.weight", "output_norm.weight"}};
  for (int l = 0; l < 3; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    const std::string p = "model.layers." + std::to_string(l) + ".";
    names[p + "self_attn.q_proj.weight"] = b + "attn_q.weight";
    names[p + "self_attn.q_proj.bias"] = b + "attn_q.bias";
    names[p + "self_attn.k_proj.weight"] = b + "attn_k.weight";
    names[p + "self_attn.v_proj.bias"] = b + "attn_v.bias";
    names[p + "self_attn.o_proj.weight"] = b + "attn_output.weight";
    names[p + "mlp.gate_proj.weight"] = b + "ffn_gate.weight";
    names[p + "mlp.up_proj.weight"] = b + "ffn_up.weight";
    names[p + "mlp.down_proj.weight"] = b + "ffn_down.weight";
    names[p + "post_attention_layernorm.weight"] = b + "ffn_norm.weight";
  }
  std::map<std::string, const TensorView*> hf;
  for (const TensorView& t : st.tensors()) hf[t.name] = &t;
  int n_checked = 0;
  for (const auto& [hn, gn] : names) {
    CAPTURE(hn);
    const TensorView* h = hf.at(hn);
    const TensorView* g = f32.find_tensor(gn);
    REQUIRE(g != nullptr);
    CHECK(h->dtype == DType::bf16);
    CHECK(h->shape == g->shape);
    const auto a = h->to_f32();
    const auto b = g->to_f32();
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);

    const TensorView* q = q8.find_tensor(gn);
    REQUIRE(q != nullptr);
    const auto c = q->to_f32();
    if (q->dtype == DType::q8_0) {
      // Each block of 32: |dequantized - original| <= half a step + f16 rounding of the scale.
      size_t n_outside = 0;
      for (size_t blk = 0; blk < b.size() / 32; ++blk) {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(b[blk * 32 + i]));
        const float step = amax / 127.0f;
        for (int i = 0; i < 32; ++i) {
          n_outside += std::fabs(c[blk * 32 + i] - b[blk * 32 + i]) > step * 0.5f + amax * 1e-3f;
        }
      }
      CHECK(n_outside == 0);
    } else {
      CHECK(c == b);  // norms and biases stay f32
    }
    ++n_checked;
  }
  CHECK(n_checked == static_cast<int>(names.size()));
  CHECK(q8.find_tensor("token_embd.weight")->dtype == DType::q8_0);
}

TEST_CASE("GGUF writer round trip: every metadata type, nested arrays, tensors") {
  llm::test::TempDir dir;
  GgufWriter w;
  w.set("u8", GgufValue{GgufType::u8, GgufType::u8, uint64_t{200}});
  w.set("i8", GgufValue{GgufType::i8, GgufType::u8, int64_t{-100}});
  w.set("u16", GgufValue{GgufType::u16, GgufType::u8, uint64_t{60000}});
  w.set("i16", GgufValue{GgufType::i16, GgufType::u8, int64_t{-30000}});
  w.set_u32("u32", 4000000000u);
  w.set("i32", GgufValue{GgufType::i32, GgufType::u8, int64_t{-2000000000}});
  w.set("u64", GgufValue{GgufType::u64, GgufType::u8, uint64_t{1} << 63});
  w.set("i64", GgufValue{GgufType::i64, GgufType::u8, int64_t{-(int64_t{1} << 62)}});
  w.set_f32("f32", 0.5f);
  w.set("f64", GgufValue{GgufType::f64, GgufType::u8, 1e300});
  w.set_bool("bool", true);
  w.set_string("str", "héllo");
  std::vector<GgufValue> inner1 = {GgufValue{GgufType::i32, GgufType::u8, int64_t{1}},
                                   GgufValue{GgufType::i32, GgufType::u8, int64_t{2}}};
  std::vector<GgufValue> inner2 = {GgufValue{GgufType::i32, GgufType::u8, int64_t{3}}};
  std::vector<GgufValue> outer = {GgufValue{GgufType::array, GgufType::i32, inner1},
                                  GgufValue{GgufType::array, GgufType::i32, inner2}};
  w.set("nested", GgufValue{GgufType::array, GgufType::array, outer});
  w.set_string_array("strs", {"a", "", "ccc"});
  std::vector<float> vals = {1, 2, 3, 4, 5, 6};
  std::vector<std::byte> data(reinterpret_cast<const std::byte*>(vals.data()),
                              reinterpret_cast<const std::byte*>(vals.data() + 6));
  w.add_tensor("t", DType::f32, {2, 3}, data);
  w.add_tensor("u", DType::f32, {6}, data);
  w.write(dir / "x.gguf");

  GgufFile g(dir / "x.gguf");
  CHECK(g.get_int("u8") == 200);
  CHECK(g.get_int("i8") == -100);
  CHECK(g.get_int("u16") == 60000);
  CHECK(g.get_int("i16") == -30000);
  CHECK(g.get_int("u32") == 4000000000LL);
  CHECK(g.get_int("i32") == -2000000000LL);
  CHECK_THROWS(g.get_int("u64"));  // beyond int64
  CHECK(g.get_float("u64") == doctest::Approx(9.223372036854775808e18));
  CHECK(g.get_int("i64") == -(int64_t{1} << 62));
  CHECK(g.get_float("f32") == 0.5);
  CHECK(g.get_float("f64") == 1e300);
  CHECK(g.get_bool("bool") == true);
  CHECK(g.get_string("str") == "héllo");
  CHECK(*g.get_string_array("strs") == std::vector<std::string>{"a", "", "ccc"});
  const GgufValue* n = g.find("nested");
  REQUIRE(n != nullptr);
  REQUIRE(n->as_array()->size() == 2);
  CHECK(n->as_array()->at(0).as_array()->at(1).as_int() == 2);
  CHECK(n->as_array()->at(1).as_array()->at(0).as_int() == 3);
  CHECK(g.find_tensor("t")->shape == std::vector<int64_t>{2, 3});
  CHECK(g.find_tensor("u")->to_f32() == vals);
  CHECK(g.find_tensor("t")->to_f32() == vals);
}
