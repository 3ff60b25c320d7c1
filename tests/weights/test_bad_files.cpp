// Broken model files: each gives an exception naming the file and the
// problem; none crashes or reads out of bounds (run under ASan in CI's sanitizer job).
#include <doctest/doctest.h>

#include <cstring>

#include "fixtures.h"
#include "weights/checkpoint.h"
#include "weights/gguf.h"
#include "weights/gguf_writer.h"
#include "weights/tokenizer.h"

using namespace llm::weights;
using namespace llm::test;

namespace {

template <typename T>
void patch(std::string& bytes, size_t at, T value) {
  REQUIRE(at + sizeof(T) <= bytes.size());
  std::memcpy(bytes.data() + at, &value, sizeof(T));
}

std::string as_string(const std::vector<std::byte>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size());
}

// A GGUF with no metadata and one 1-D f32 tensor named "t" of 8 values.
// Layout: header 24 bytes; name 8+1; n_dims 4; dim 8; type at byte 45; offset at byte 49.
std::string one_tensor_gguf() {
  GgufWriter w;
  std::vector<std::byte> data(32, std::byte{0});
  w.add_tensor("t", DType::f32, {8}, data);
  return as_string(w.serialize());
}

// Re-writes a GGUF file, letting the caller drop tensors or change metadata.
void rewrite_gguf(const GgufFile& src, const std::filesystem::path& out,
                  const std::function<bool(const std::string&)>& keep_tensor,
                  const std::function<void(GgufWriter&)>& edit = {}) {
  GgufWriter w;
  for (const auto& [k, v] : src.metadata()) w.set(k, v);
  for (const TensorView& t : src.tensors()) {
    if (!keep_tensor(t.name)) continue;
    w.add_tensor(t.name, t.dtype, t.shape, std::vector<std::byte>(t.data, t.data + t.n_bytes));
  }
  if (edit) edit(w);
  w.write(out);
}

}  // namespace

TEST_CASE("GGUF: wrong magic, bad version, empty file") {
  TempDir dir;
  std::string good = one_tensor_gguf();
  REQUIRE_NOTHROW(GgufFile([&] { write_file(dir / "ok.gguf", good); return dir / "ok.gguf"; }()));

  std::string bad = good;
  bad[3] = 'X';
  write_file(dir / "magic.gguf", bad);
  CHECK_THROWS_WITH(GgufFile(dir / "magic.gguf"), doctest::Contains("magic.gguf: invalid GGUF: bad magic"));

  bad = good;
  patch<uint32_t>(bad, 4, 1);
  write_file(dir / "v1.gguf", bad);
  CHECK_THROWS_WITH(GgufFile(dir / "v1.gguf"), doctest::Contains("unsupported version 1"));

  write_file(dir / "empty.gguf", "");
  CHECK_THROWS_WITH(GgufFile(dir / "empty.gguf"), doctest::Contains("empty.gguf: invalid GGUF: bad magic"));
  CHECK_THROWS_WITH(GgufFile(dir / "absent.gguf"), doctest::Contains("absent.gguf: cannot open"));
}

TEST_CASE("GGUF: a real file truncated anywhere is rejected") {
  TempDir dir;
  const std::string full = read_file(model_path("stories260K/stories260K-f32.gguf"));
  for (size_t cut : {size_t{4}, size_t{10}, size_t{23}, size_t{100}, size_t{5000}, size_t{20000}, full.size() / 2,
                     full.size() - 1}) {
    CAPTURE(cut);
    write_file(dir / "cut.gguf", full.substr(0, cut));
    CHECK_THROWS_WITH_AS(GgufFile(dir / "cut.gguf"), doctest::Contains("cut.gguf: invalid GGUF"), std::runtime_error);
  }
}

TEST_CASE("GGUF: header lies") {
  TempDir dir;
  const std::string good = one_tensor_gguf();
  SUBCASE("tensor offset beyond the file") {
    std::string bad = good;
    patch<uint64_t>(bad, 49, 1u << 20);
    write_file(dir / "b.gguf", bad);
    CHECK_THROWS_WITH(GgufFile(dir / "b.gguf"), doctest::Contains("lies outside the file"));
  }
  SUBCASE("tensor offset that wraps around") {
    std::string bad = good;
    patch<uint64_t>(bad, 49, ~uint64_t{0} - 31);
    write_file(dir / "b.gguf", bad);
    CHECK_THROWS_WITH(GgufFile(dir / "b.gguf"), doctest::Contains("lies outside the file"));
  }
  SUBCASE("unsupported tensor type is named") {
    std::string bad = good;
    patch<uint32_t>(bad, 45, 6);  // Q5_0
    write_file(dir / "b.gguf", bad);
    CHECK_THROWS_WITH(GgufFile(dir / "b.gguf"), doctest::Contains("type Q5_0 (id 6), which is not supported"));
  }
  SUBCASE("absurd dimension") {
    std::string bad = good;
    patch<uint64_t>(bad, 37, uint64_t{1} << 62);
    write_file(dir / "b.gguf", bad);
    CHECK_THROWS_WITH(GgufFile(dir / "b.gguf"), doctest::Contains("invalid dimension"));
  }
  SUBCASE("tensor count larger than the file could hold") {
    std::string bad = good;
    patch<uint64_t>(bad, 8, uint64_t{1} << 40);
    write_file(dir / "b.gguf", bad);
    CHECK_THROWS_WITH(GgufFile(dir / "b.gguf"), doctest::Contains("tensor count"));
  }
  SUBCASE("string length beyond the file") {
    std::string bad = good;
    patch<uint64_t>(bad, 24, uint64_t{1} << 40);  // the tensor name's length
    write_file(dir / "b.gguf", bad);
    CHECK_THROWS_WITH(GgufFile(dir / "b.gguf"), doctest::Contains("truncated string"));
  }
  SUBCASE("array count beyond the file") {
    GgufWriter w;
    w.set_string_array("arr", {"a", "b"});
    std::string bad = as_string(w.serialize());
    // header 24, key 8+3, type 4, elem type 4, then the count.
    patch<uint64_t>(bad, 24 + 11 + 4 + 4, uint64_t{1} << 59);
    write_file(dir / "b.gguf", bad);
    CHECK_THROWS_WITH(GgufFile(dir / "b.gguf"), doctest::Contains("exceeds the file"));
  }
  SUBCASE("unknown metadata type") {
    GgufWriter w;
    w.set_u32("k", 1);
    std::string bad = as_string(w.serialize());
    patch<uint32_t>(bad, 24 + 9, 99);
    write_file(dir / "b.gguf", bad);
    CHECK_THROWS_WITH(GgufFile(dir / "b.gguf"), doctest::Contains("unknown type 99"));
  }
}

TEST_CASE("safetensors: broken files") {
  TempDir dir;
  const std::string ok = make_safetensors({{"a", {"F32", {2}, f32_bytes({1, 2})}}, {"b", {"F32", {1}, f32_bytes({3})}}});
  auto expect = [&](const std::string& bytes, const char* text) {
    write_file(dir / "bad.safetensors", bytes);
    try {
      SafetensorsFile f(dir / "bad.safetensors");
      FAIL("no exception for a file that should fail with: " << text);
    } catch (const std::runtime_error& e) {
      const std::string message = e.what();
      CHECK_MESSAGE(message.find("bad.safetensors: invalid safetensors file: ") != std::string::npos, message);
      CHECK_MESSAGE(message.find(text) != std::string::npos, message);
    }
  };
  expect("abc", "shorter than its 8-byte header length");
  std::string lie = ok;
  patch<uint64_t>(lie, 0, 1000000);
  expect(lie, "exceeds the file");
  std::string huge = ok;
  patch<uint64_t>(huge, 0, ~uint64_t{0});
  expect(huge, "is too large");
  std::string notjson = ok;
  notjson[8] = '[';
  notjson[9] = '!';
  expect(notjson, "header is not valid JSON");
  expect(make_safetensors({{"a", {"I64", {1}, std::string(8, '\0')}}}), "dtype I64, which is not supported");
  expect(make_safetensors({{"a", {"F32", {3}, f32_bytes({1, 2})}}}), "needs 12");
  expect(make_safetensors({{"a", {"F32", {2}, f32_bytes({1, 2})}}},
                          [](nlohmann::json& h) { h["a"]["data_offsets"] = {4, 12}; }),
         "lie outside the data section");
  expect(make_safetensors({{"a", {"F32", {2}, f32_bytes({1, 2})}}, {"b", {"F32", {1}, f32_bytes({3})}}},
                          [](nlohmann::json& h) { h["b"]["data_offsets"] = {4, 8}; }),
         "overlap");
  expect(make_safetensors({{"a", {"F32", {2}, f32_bytes({1, 2})}}},
                          [](nlohmann::json& h) { h["a"]["shape"] = {-2}; }),
         "non-integer dimension");
  expect(make_safetensors({{"a", {"F32", {2}, f32_bytes({1, 2})}}},
                          [](nlohmann::json& h) { h["a"].erase("dtype"); }),
         "has no dtype");
  const std::string real = read_file(model_path("stories260K/model.safetensors"));
  expect(real.substr(0, real.size() / 2), "lie outside the data section");
}

TEST_CASE("checkpoint: missing tensors, shape and vocab mismatches") {
  TempDir dir;
  SUBCASE("missing tensor") {
    make_stories_dir(dir.path(), [](auto& t) { t.erase("model.layers.2.mlp.up_proj.weight"); });
    CHECK_THROWS_WITH(Checkpoint(dir.path()), doctest::Contains("missing tensor model.layers.2.mlp.up_proj.weight"));
  }
  SUBCASE("shape mismatch") {
    make_stories_dir(dir.path(), [](auto& t) {
      t["model.layers.1.mlp.gate_proj.weight"] = RawTensor{"F32", {64, 172}, std::string(64 * 172 * 4, '\0')};
    });
    CHECK_THROWS_WITH(Checkpoint(dir.path()),
                      doctest::Contains("model.layers.1.mlp.gate_proj.weight has shape [64, 172], config expects [172, 64]"));
  }
  SUBCASE("config vocab differs from the embedding") {
    make_stories_dir(dir.path(), {}, [](auto& c) { c["vocab_size"] = 500; });
    CHECK_THROWS_WITH(Checkpoint(dir.path()), doctest::Contains("vocab size mismatch"));
  }
  SUBCASE("tokenizer larger than the embedding") {
    make_stories_dir(
        dir.path(),
        [](auto& t) {
          RawTensor& e = t["model.embed_tokens.weight"];
          e.shape = {256, 64};
          e.bytes.resize(256 * 64 * 4);
        },
        [](auto& c) { c["vocab_size"] = 256; });
    Checkpoint ck(dir.path());
    CHECK_THROWS_WITH(ck.load_tokenizer(), doctest::Contains("the tokenizer has 512 tokens but the model embeds only 256"));
  }
  SUBCASE("not a model") {
    CHECK_THROWS_WITH(Checkpoint(dir.path()), doctest::Contains("no config.json"));
    CHECK_THROWS_WITH(Checkpoint(dir / "nothing-here"), doctest::Contains("no such model directory or GGUF file"));
    make_stories_dir(dir.path());
    std::filesystem::remove(dir / "model.safetensors");
    CHECK_THROWS_WITH(Checkpoint(dir.path()), doctest::Contains("no model.safetensors"));
  }
}

TEST_CASE("checkpoint: GGUF with a missing tensor or unsupported architecture") {
  TempDir dir;
  GgufFile src(model_path("stories260K/stories260K-f32.gguf"));
  rewrite_gguf(src, dir / "ok.gguf", [](const std::string&) { return true; });
  Checkpoint ok(dir / "ok.gguf");
  CHECK(ok.config().n_layers == 5);

  rewrite_gguf(src, dir / "missing.gguf", [](const std::string& n) { return n != "blk.3.attn_k.weight"; });
  CHECK_THROWS_WITH(Checkpoint(dir / "missing.gguf"), doctest::Contains("missing tensor blk.3.attn_k.weight"));

  rewrite_gguf(src, dir / "arch.gguf", [](const std::string&) { return true; },
               [](GgufWriter& w) { w.set_string("general.architecture", "falcon"); });
  CHECK_THROWS_WITH(Checkpoint(dir / "arch.gguf"), doctest::Contains("architecture \"falcon\" is not supported"));

  rewrite_gguf(src, dir / "noeps.gguf", [](const std::string&) { return true; },
               [](GgufWriter& w) { w.set_u32("llama.block_count", 6); });
  CHECK_THROWS_WITH(Checkpoint(dir / "noeps.gguf"), doctest::Contains("missing tensor blk.5."));
}
