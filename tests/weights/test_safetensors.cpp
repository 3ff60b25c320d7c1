// safetensors: single files of each dtype and sharded checkpoints.
#include <doctest/doctest.h>

#include "fixtures.h"
#include "weights/safetensors.h"

using namespace llm::weights;
using namespace llm::test;

TEST_CASE("safetensors: F32, F16 and BF16 tensors read back exactly") {
  TempDir dir;
  const uint16_t f16[3] = {0x3C00, 0xC000, 0x3555};  // 1, -2, 0.333251953125
  const uint16_t bf16[2] = {0x3F80, 0x4049};          // 1, 3.140625
  std::map<std::string, RawTensor> t = {
      {"a", {"F32", {2, 2}, f32_bytes({1.5f, -2.0f, 0.0f, 4.25f})}},
      {"b", {"F16", {3}, std::string(reinterpret_cast<const char*>(f16), 6)}},
      {"c", {"BF16", {1, 2}, std::string(reinterpret_cast<const char*>(bf16), 4)}},
      {"scalar", {"F32", {}, f32_bytes({7.0f})}},
  };
  write_file(dir / "m.safetensors", make_safetensors(t, [](nlohmann::json& h) {
               h["__metadata__"] = {{"format", "pt"}};
             }));
  SafetensorsFile f(dir / "m.safetensors");
  REQUIRE(f.tensors().size() == 4);
  CHECK(f.metadata().at("format") == "pt");
  std::map<std::string, const TensorView*> by;
  for (const auto& x : f.tensors()) by[x.name] = &x;
  CHECK(by.at("a")->shape == std::vector<int64_t>{2, 2});
  CHECK(by.at("a")->to_f32() == std::vector<float>{1.5f, -2.0f, 0.0f, 4.25f});
  CHECK(by.at("b")->dtype == DType::f16);
  CHECK(by.at("b")->to_f32() == std::vector<float>{1.0f, -2.0f, 0.333251953125f});
  CHECK(by.at("c")->to_f32() == std::vector<float>{1.0f, 3.140625f});
  CHECK(by.at("scalar")->n_elements() == 1);
  CHECK(by.at("scalar")->to_f32() == std::vector<float>{7.0f});
}

TEST_CASE("sharded checkpoint via model.safetensors.index.json") {
  TempDir dir;
  write_file(dir / "model-00001-of-00002.safetensors",
             make_safetensors({{"x", {"F32", {2}, f32_bytes({1, 2})}}, {"y", {"F32", {1}, f32_bytes({3})}}}));
  write_file(dir / "model-00002-of-00002.safetensors", make_safetensors({{"z", {"F32", {3}, f32_bytes({4, 5, 6})}}}));
  nlohmann::json index = {{"metadata", {{"total_size", 24}}},
                          {"weight_map",
                           {{"x", "model-00001-of-00002.safetensors"},
                            {"y", "model-00001-of-00002.safetensors"},
                            {"z", "model-00002-of-00002.safetensors"}}}};
  write_file(dir / "model.safetensors.index.json", index.dump());
  CHECK(SafetensorsModel::present(dir.path()));
  SafetensorsModel m(dir.path());
  CHECK(m.tensors().size() == 3);
  CHECK(m.find("z")->to_f32() == std::vector<float>{4, 5, 6});
  CHECK(m.find("x")->to_f32() == std::vector<float>{1, 2});
  CHECK(m.find("nope") == nullptr);

  SUBCASE("a tensor the index names but the shard lacks") {
    index["weight_map"]["w"] = "model-00002-of-00002.safetensors";
    write_file(dir / "model.safetensors.index.json", index.dump());
    CHECK_THROWS_WITH(SafetensorsModel(dir.path()), doctest::Contains("tensor 'w' is listed in shard"));
  }
  SUBCASE("a missing shard file") {
    index["weight_map"]["w"] = "model-00003-of-00002.safetensors";
    write_file(dir / "model.safetensors.index.json", index.dump());
    CHECK_THROWS_WITH(SafetensorsModel(dir.path()), doctest::Contains("model-00003-of-00002.safetensors: cannot open"));
  }
  SUBCASE("a shard path that escapes the directory") {
    index["weight_map"]["w"] = "../evil.safetensors";
    write_file(dir / "model.safetensors.index.json", index.dump());
    CHECK_THROWS_WITH(SafetensorsModel(dir.path()), doctest::Contains("plain file name"));
  }
}

TEST_CASE("real checkpoints open") {
  SafetensorsModel stories(model_path("stories260K"));
  CHECK(stories.tensors().size() == 47);  // tied embeddings: no lm_head
  CHECK(stories.find("model.embed_tokens.weight")->shape == std::vector<int64_t>{512, 64});
  SafetensorsModel qwen(model_path("tiny-qwen2"));
  CHECK(qwen.find("model.layers.2.self_attn.k_proj.bias")->dtype == DType::bf16);
}
