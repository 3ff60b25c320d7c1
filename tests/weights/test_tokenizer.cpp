// Tokenizer tests: reference tokenizations (llama.cpp's tokenizer-tests, made
// with Hugging Face), HF tokenizer.json against GGUF vocabs of the same model,
// special tokens, BOS/EOS, byte fallback, streaming detokenization, and the
// errors a broken tokenizer.json gives.
#include <doctest/doctest.h>

#include <algorithm>
#include <ctime>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "test_util.h"
#include "weights/detokenizer.h"
#include "weights/gguf.h"
#include "weights/gguf_writer.h"
#include "weights/pretokenize.h"
#include "weights/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using llm::test::model_path;
using llm::weights::GgufFile;
using llm::weights::IncrementalDetokenizer;
using llm::weights::Tokenizer;
using llm::weights::TokenizerKind;
using Ids = std::vector<int32_t>;

struct VocabCase {
  std::string text;
  Ids ids;
};

// llama.cpp's format: the .inp file is text + "\n__ggml_vocab_test__\n" per
// case; the .out file has a line per case with each id preceded by a space.
std::vector<std::string> read_inputs(const std::string& name) {
  const std::string inp = llm::test::read_file(model_path("tokenizer-tests/" + name + ".inp"));
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t pos = 0;
  for (size_t hit; (hit = inp.find(sep, pos)) != std::string::npos; pos = hit + sep.size()) {
    texts.push_back(inp.substr(pos, hit - pos));
  }
  REQUIRE(pos == inp.size());  // nothing after the last separator
  return texts;
}

std::vector<VocabCase> read_cases(const std::string& name) {
  std::vector<std::string> texts = read_inputs(name);
  std::istringstream out(llm::test::read_file(model_path("tokenizer-tests/" + name + ".out")));
  std::vector<VocabCase> cases;
  for (std::string& text : texts) {
    std::string line;
    REQUIRE(std::getline(out, line));
    std::istringstream ids(line);
    Ids expected;
    for (int32_t id; ids >> id;) expected.push_back(id);
    cases.push_back({std::move(text), std::move(expected)});
  }
  std::string extra;
  REQUIRE_FALSE(std::getline(out, extra));
  REQUIRE(cases.size() == 46);
  return cases;
}

// Loaded once: the 151k-token vocabs are the expensive part of the suite.
const Tokenizer& qwen2_hf() {
  static const Tokenizer t = Tokenizer::from_hf_dir(model_path("qwen2-tokenizer"));
  return t;
}
const Tokenizer& qwen2_gguf() {
  static const Tokenizer t = Tokenizer::from_gguf(GgufFile(model_path("tiny-qwen2/tiny-qwen2-f32.gguf")));
  return t;
}
const Tokenizer& llama_spm_gguf() {
  static const Tokenizer t =
      Tokenizer::from_gguf(GgufFile(model_path("tokenizer-tests/ggml-vocab-llama-spm.gguf")));
  return t;
}
// The same Qwen2 tokenizer with the model's generation_config.json and config.json.
const Tokenizer& tiny_qwen2_hf() {
  static const Tokenizer t = Tokenizer::from_hf_dir(model_path("tiny-qwen2"));
  return t;
}
const Tokenizer& stories_hf() {
  static const Tokenizer t = Tokenizer::from_hf_dir(model_path("stories260K"));
  return t;
}
const Tokenizer& stories_gguf() {
  static const Tokenizer t = Tokenizer::from_gguf(GgufFile(model_path("stories260K/stories260K-f32.gguf")));
  return t;
}

Ids cat(Ids a, const Ids& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string nfc(std::string_view s) { return llm::weights::unicode_normalize(s, llm::weights::UnicodeForm::nfc); }

// Process CPU time: unlike wall time, not inflated by other jobs on the machine.
double cpu_seconds() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

// The message of the exception f throws ("" if none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

nlohmann::json stories_json() {
  return nlohmann::json::parse(llm::test::read_file(model_path("stories260K/tokenizer.json")));
}

void check_reference_cases(const Tokenizer& tok, const std::string& cases_name) {
  for (const VocabCase& c : read_cases(cases_name)) {
    CAPTURE(c.text);
    CHECK(tok.encode(c.text) == c.ids);
    // Qwen2 NFC-normalises its input, so a non-NFC case can only come back in
    // its NFC form (all of the current cases are NFC already).
    const std::string expected = tok.kind() == TokenizerKind::byte_level_bpe ? nfc(c.text) : c.text;
    CHECK(tok.decode(c.ids) == expected);
  }
}

}  // namespace

TEST_CASE("Qwen2 tokenizer.json reproduces the reference tokenizations") {
  CHECK(qwen2_hf().kind() == TokenizerKind::byte_level_bpe);
  check_reference_cases(qwen2_hf(), "ggml-vocab-qwen2.gguf");
}

TEST_CASE("Qwen2 GGUF vocab reproduces the reference tokenizations") {
  CHECK(qwen2_gguf().kind() == TokenizerKind::byte_level_bpe);
  check_reference_cases(qwen2_gguf(), "ggml-vocab-qwen2.gguf");
}

TEST_CASE("Llama SPM GGUF vocab reproduces the reference tokenizations") {
  CHECK(llama_spm_gguf().kind() == TokenizerKind::sentencepiece_bpe);
  CHECK(llama_spm_gguf().n_vocab() == 32000);
  // add_space_prefix: "ied" starts with "▁i" (474).
  CHECK(llama_spm_gguf().encode("ied 4 ½ months").front() == 474);
  check_reference_cases(llama_spm_gguf(), "ggml-vocab-llama-spm.gguf");
}

TEST_CASE("stories260K tokenizer.json (merge ranks) and GGUF (scores) tokenize alike") {
  const Tokenizer& hf = stories_hf();
  const Tokenizer& gguf = stories_gguf();
  CHECK(hf.kind() == TokenizerKind::sentencepiece_bpe);
  CHECK(gguf.kind() == TokenizerKind::sentencepiece_bpe);
  CHECK(hf.n_vocab() == 512);
  CHECK(gguf.n_vocab() == 512);
  size_t n_cases = 0;
  for (const char* file : {"ggml-vocab-qwen2.gguf", "ggml-vocab-llama-spm.gguf", "ggml-vocab-deepseek-r1-qwen.gguf"}) {
    for (const std::string& text : read_inputs(file)) {
      CAPTURE(text);
      const Ids ids = hf.encode(text);
      CHECK(gguf.encode(text) == ids);
      CHECK(gguf.encode(text, true) == hf.encode(text, true));
      // Byte fallback covers every character: never <unk>.
      CHECK(std::find(ids.begin(), ids.end(), 0) == ids.end());
      CHECK(hf.decode(ids) == text);
      CHECK(gguf.decode(ids) == text);
      ++n_cases;
    }
  }
  CHECK(n_cases == 3 * 46);
}

TEST_CASE("both formats of a model agree on random text, which round-trips") {
  // Random strings from fragments that stress the regexes, merges, byte
  // fallback and special-token matching. Fixed seed: failures reproduce.
  const std::vector<std::string> fragments = {
      "Hello", " world", "  ", "\n", "\r\n", "\t", "123", "4567", "'s", "'LL", "don't", "...", "!?",
      "你好", "世界", "🦙", "😶\u200d🌫️", "é", "e\u0301", "Ω", "ß", "ﬁ", "\u00a0", "\u3000", "___",
      "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<", "|", ">", "-", "▁", "\x7f", "\x01", "a", "Z",
  };
  uint64_t state = 0x9E3779B97F4A7C15ULL;
  const auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (int i = 0; i < 300; ++i) {
    std::string text;
    const size_t n = next() % 12;
    for (size_t k = 0; k < n; ++k) text += fragments[next() % fragments.size()];
    CAPTURE(text);
    for (bool parse_special : {true, false}) {
      const Ids qwen = qwen2_hf().encode(text, false, parse_special);
      CHECK(qwen2_gguf().encode(text, false, parse_special) == qwen);
      CHECK(qwen2_hf().decode(qwen) == nfc(text));
      const Ids stories = stories_hf().encode(text, true, parse_special);
      CHECK(stories_gguf().encode(text, true, parse_special) == stories);
      // Sentencepiece round-trips only plain text: "▁" decodes as a space, and
      // the text after a special token gets a "▁" of its own.
      if (!parse_special && text.find("▁") == std::string::npos) {
        CHECK(stories_hf().decode(stories, true) == text);
        CHECK(llama_spm_gguf().decode(llama_spm_gguf().encode(text, false, false)) == text);
      }
    }
  }
}

TEST_CASE("special tokens are matched only with parse_special") {
  const std::string chat = "<|im_start|>user\nhi<|im_end|>";
  for (const Tokenizer* tok : {&qwen2_hf(), &qwen2_gguf()}) {
    CHECK(tok->encode(chat) == Ids{151644, 872, 198, 6023, 151645});
    const Ids plain = tok->encode(chat, false, false);
    CHECK(plain == Ids{27, 91, 318, 4906, 91, 29, 872, 198, 6023, 27, 91, 318, 6213, 91, 29});
    CHECK(tok->decode(plain) == chat);
    CHECK(tok->decode(tok->encode(chat)) == chat);
    CHECK(tok->decode(tok->encode(chat), true) == "user\nhi");
    CHECK(tok->is_special(151644));
    CHECK_FALSE(tok->is_special(872));
    // Added tokens that are not special (<tool_call>) are always matched, as
    // in Hugging Face, but not skipped as special.
    CHECK(tok->find_token("<tool_call>") == 151657);
    CHECK(tok->encode("<tool_call>", false, false) == Ids{151657});
    CHECK_FALSE(tok->is_special(151657));
    // Longest match first: <|im_start|> is not read as a shorter token.
    CHECK(tok->encode("a<|im_start|><|im_end|>b") == Ids{64, 151644, 151645, 65});
  }
  for (const Tokenizer* tok : {&stories_hf(), &stories_gguf()}) {
    // The text after a special token gets its own "▁" prefix, as in both HF and llama.cpp.
    CHECK(tok->encode("<s>Once upon") == cat({1}, tok->encode("Once upon")));
    const Ids plain = tok->encode("<s>", false, false);
    CHECK(std::find(plain.begin(), plain.end(), 1) == plain.end());
    CHECK(tok->decode(plain) == "<s>");
  }
}

TEST_CASE("BOS is added only when the model asks for it") {
  for (const Tokenizer* tok : {&stories_hf(), &stories_gguf()}) {
    CHECK(tok->add_bos());
    CHECK(tok->bos_id() == 1);
    CHECK(tok->bos_text() == "<s>");
    CHECK(tok->encode("Once upon a time", true).front() == 1);
    CHECK(tok->encode("Once upon a time", true).size() == tok->encode("Once upon a time").size() + 1);
    CHECK(tok->encode("Once upon a time", false).front() != 1);
    CHECK(tok->encode("", true) == Ids{1});
    CHECK(tok->encode("").empty());
  }
  for (const Tokenizer* tok : {&qwen2_hf(), &qwen2_gguf()}) {
    CHECK_FALSE(tok->add_bos());
    CHECK(tok->encode("Hello world", true) == tok->encode("Hello world", false));
  }
}

TEST_CASE("EOS, PAD and end-of-generation ids") {
  for (const Tokenizer* tok : {&qwen2_hf(), &tiny_qwen2_hf(), &qwen2_gguf()}) {
    CHECK(tok->eos_id() == 151645);
    CHECK(tok->eos_text() == "<|im_end|>");
    CHECK(tok->pad_id() == 151643);
    CHECK(tok->eog_ids() == Ids{151643, 151645});
    CHECK(tok->is_eog(151645));
    CHECK(tok->is_eog(151643));
    CHECK_FALSE(tok->is_eog(151644));
  }
  // tokenizer_config.json says bos_token null; like llama.cpp's converter we
  // then take generation_config.json's bos_token_id, so both formats agree.
  CHECK_FALSE(qwen2_hf().bos_id().has_value());  // no generation_config.json there
  CHECK(tiny_qwen2_hf().bos_id() == 151643);
  CHECK(qwen2_gguf().bos_id() == 151643);
  CHECK(tiny_qwen2_hf().eog_ids() == qwen2_gguf().eog_ids());
  for (const Tokenizer* tok : {&stories_hf(), &stories_gguf(), &llama_spm_gguf()}) {
    CHECK(tok->eos_id() == 2);
    CHECK(tok->eog_ids() == Ids{2});
    CHECK_FALSE(tok->is_eog(1));
  }
}

TEST_CASE("byte fallback for characters missing from a small vocab") {
  const std::string cjk = "你好";  // neither character is among stories260K's 512 tokens
  for (const Tokenizer* tok : {&stories_hf(), &stories_gguf()}) {
    CHECK_FALSE(tok->find_token("你").has_value());
    const Ids ids = tok->encode(cjk);
    // "▁" then the six UTF-8 bytes as <0xE4> <0xBD> <0xA0> <0xE5> <0xA5> <0xBD> (ids 3 + byte).
    REQUIRE(ids.size() == 7);
    CHECK(tok->token_text(ids[0]) == "▁");
    CHECK(Ids(ids.begin() + 1, ids.end()) == Ids{3 + 0xE4, 3 + 0xBD, 3 + 0xA0, 3 + 0xE5, 3 + 0xA5, 3 + 0xBD});
    CHECK(tok->token_bytes(3 + 0xE4) == "\xE4");
    CHECK(tok->decode(ids) == cjk);
    CHECK(tok->decode(tok->encode("a 你 b")) == "a 你 b");
  }
}

TEST_CASE("an unknown character without byte tokens becomes <unk>") {
  // A tiny sentencepiece vocab with no byte tokens.
  llm::test::TempDir dir;
  llm::weights::GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "ab"});
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  std::vector<llm::weights::GgufValue> types, scores;
  for (int t : {2, 3, 3, 1, 1, 1, 1, 1}) types.push_back({llm::weights::GgufType::i32, {}, int64_t{t}});
  for (double s : {0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -0.5, -0.25}) {
    scores.push_back({llm::weights::GgufType::f32, {}, s});
  }
  w.set("tokenizer.ggml.token_type", {llm::weights::GgufType::array, llm::weights::GgufType::i32, types});
  w.set("tokenizer.ggml.scores", {llm::weights::GgufType::array, llm::weights::GgufType::f32, scores});
  w.write(dir / "tiny.gguf");
  const Tokenizer tok = Tokenizer::from_gguf(GgufFile(dir / "tiny.gguf"));
  CHECK(tok.encode("a€b") == Ids{6, 0, 5});
  // The highest-scoring pair merges first: "ab" (-0.25) beats "▁a" (-0.5).
  CHECK(tok.encode("ab") == Ids{3, 7});
  CHECK(tok.add_bos());  // the default for sentencepiece vocabs
  CHECK(tok.encode("a", true) == Ids{1, 6});
}

TEST_CASE("incremental detokenizer never emits a broken UTF-8 sequence") {
  SUBCASE("emoji split over byte-level tokens") {
    const Tokenizer& tok = qwen2_hf();
    const std::string text = " this is 🦙.cpp and 😁 ?我想在apple工作";
    const Ids ids = tok.encode(text);
    IncrementalDetokenizer detok(tok);
    std::string joined;
    size_t n_held = 0;
    for (int32_t id : ids) {
      const std::string piece = detok.push(id);
      CHECK(llm::weights::is_valid_utf8(piece));
      if (piece.empty()) ++n_held;
      joined += piece;
    }
    joined += detok.flush();
    CHECK(n_held > 0);  // 🦙 is 11162 99 247: the first two hold their bytes
    CHECK(joined == text);
    CHECK(joined == tok.decode(ids));
  }
  SUBCASE("CJK as sentencepiece byte-fallback tokens, no leading-space strip") {
    const Tokenizer& tok = stories_gguf();
    const Ids ids = tok.encode("你好 world");
    IncrementalDetokenizer detok(tok);
    std::vector<std::string> pieces;
    for (int32_t id : ids) pieces.push_back(detok.push(id));
    pieces.push_back(detok.flush());
    for (const std::string& p : pieces) CHECK(llm::weights::is_valid_utf8(p));
    CHECK(pieces[1] == "");   // <0xE4> alone is not a character yet
    CHECK(pieces[3] == "你");  // ... until its third byte arrives
    const std::string joined = std::accumulate(pieces.begin(), pieces.end(), std::string());
    CHECK(joined == " 你好 world");  // a continuation keeps its leading space
    CHECK(tok.decode(ids) == "你好 world");
  }
  SUBCASE("bytes that can never be valid come out at once as U+FFFD") {
    const Tokenizer& tok = stories_hf();
    IncrementalDetokenizer detok(tok);
    CHECK(detok.push(3 + 0xFF) == "\uFFFD");             // 0xFF never starts a character
    CHECK(detok.push(3 + 0xE0) == "");                   // may become a character...
    CHECK(detok.push(3 + 0x80) == "\uFFFD\uFFFD");       // ...but E0 80 is an overlong
    CHECK(detok.push(3 + 0xE4) == "");
    CHECK(detok.push(3 + 'a') == "\uFFFDa");             // interrupted sequence
    CHECK(detok.push(3 + 0xF0) == "");
    CHECK(detok.flush() == "\uFFFD");                    // truncated at the end of the stream
    CHECK(detok.flush() == "");
  }
  SUBCASE("special tokens") {
    const Tokenizer& tok = qwen2_hf();
    IncrementalDetokenizer skipping(tok);
    CHECK(skipping.push(151645) == "");
    CHECK(skipping.push(21927) == " Hello");
    IncrementalDetokenizer showing(tok, false);
    CHECK(showing.push(151645) == "<|im_end|>");
  }
}

TEST_CASE("long inputs encode in near-linear time and round-trip") {
  std::string text;
  const std::vector<std::string> cases = read_inputs("ggml-vocab-qwen2.gguf");
  while (text.size() < 100 * 1024) {
    for (const std::string& c : cases) text += c + "\n";
  }
  const std::vector<std::pair<std::string, std::string>> inputs = {
      {"mixed", text},
      {"spaces", std::string(100 * 1024, ' ')},
      {"one letter", std::string(100 * 1024, 'a')},
      {"digits", std::string(100 * 1024, '7')},
      {"newlines and tabs", [] {
         std::string s;
         while (s.size() < 100 * 1024) s += " \n\t \n\n  ";
         return s;
       }()},
  };
  for (const Tokenizer* tok : {&qwen2_hf(), &stories_hf(), &llama_spm_gguf()}) {
    for (const auto& [name, input] : inputs) {
      CAPTURE(name);
      const double start = cpu_seconds();
      const Ids ids = tok->encode(input);
      const double elapsed = cpu_seconds() - start;
      CHECK(!ids.empty());
      CHECK(ids.size() <= input.size() + 1);  // at worst a token per byte, plus SPM's "▁"
      CHECK(tok->decode(ids) == (tok->kind() == TokenizerKind::byte_level_bpe ? nfc(input) : input));
#ifdef NDEBUG  // timing is only meaningful in optimised, uninstrumented builds
      CHECK(elapsed < 0.5);
#else
      (void)elapsed;
#endif
    }
  }
}

TEST_CASE("the Qwen2 tokenizer.json loads quickly") {
  const double start = cpu_seconds();
  const Tokenizer tok = Tokenizer::from_hf_dir(model_path("qwen2-tokenizer"));
  const double elapsed = cpu_seconds() - start;
  CHECK(tok.n_vocab() == 151665);
#ifdef NDEBUG
  CHECK(elapsed < 1.0);
#else
  (void)elapsed;
#endif
}

TEST_CASE("NFC normalisation where the tokenizer asks for it") {
  const std::string decomposed = "Cafe\u0301";  // e + combining acute
  const std::string composed = "Caf\u00E9";
  for (const Tokenizer* tok : {&qwen2_hf(), &qwen2_gguf()}) {
    CHECK(tok->encode(decomposed) == tok->encode(composed));
    CHECK(tok->decode(tok->encode(decomposed)) == composed);
  }
  // stories260K has no normalizer: the combining mark stays a separate character.
  CHECK(stories_hf().decode(stories_hf().encode(decomposed)) == decomposed);
}

TEST_CASE("decode and token accessors") {
  const Tokenizer& tok = qwen2_hf();
  CHECK(tok.token_text(21927) == "ĠHello");
  CHECK(tok.token_bytes(21927) == " Hello");
  CHECK(tok.find_token("ĠHello") == 21927);
  CHECK_FALSE(tok.find_token("no such token").has_value());
  // Ids past the vocab (the model's padded embedding rows) decode to nothing.
  CHECK(tok.decode(Ids{21927, 151900, -1, 1879}) == " Hello world");
  CHECK(tok.token_bytes(151900) == "");
  // A lone continuation byte decodes as U+FFFD rather than broken UTF-8.
  const int32_t lone = *tok.find_token(llm::weights::byte_to_unicode(0xA9));
  CHECK(tok.decode(Ids{21927, lone}) == " Hello\uFFFD");
  // SPM: exactly one leading space is dropped, at the start of the text only.
  const Tokenizer& spm = llama_spm_gguf();
  CHECK(spm.decode(spm.encode("  two spaces")) == "  two spaces");
  CHECK(spm.decode(spm.encode("Hello")) == "Hello");
  CHECK(spm.decode(Ids{1, 15043}) == "<s> Hello");
  CHECK(spm.decode(Ids{1, 15043}, true) == "Hello");
}

TEST_CASE("invalid UTF-8 input is repaired, not rejected") {
  const Tokenizer& tok = qwen2_hf();
  const Ids ids = tok.encode("a\xFF b\xE4\xBD");
  CHECK(tok.decode(ids) == "a\uFFFD b\uFFFD");
}

TEST_CASE("added tokens honour lstrip and rstrip") {
  llm::test::TempDir dir;
  nlohmann::json j = stories_json();
  const auto added = [&](int id, const char* content, bool lstrip, bool rstrip) {
    j["added_tokens"].push_back({{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", lstrip},
                                 {"rstrip", rstrip}, {"normalized", false}, {"special", true}});
  };
  added(512, "<mask>", true, false);
  added(513, "<sep>", false, true);
  added(514, "<plain>", false, false);
  llm::test::write_file(dir / "tokenizer.json", j.dump());
  const Tokenizer tok = Tokenizer::from_hf_dir(dir.path());
  CHECK(tok.n_vocab() == 515);
  const Ids a = tok.encode("a");
  const Ids b = tok.encode("b");
  CHECK(tok.encode("a  <mask>") == cat(a, {512}));           // spaces absorbed on the left
  CHECK(tok.encode("<sep> \n b") == cat({513}, b));          // and on the right
  CHECK(tok.encode("a <plain>") != cat(a, {514}));           // without the flags they stay text
  CHECK(tok.encode("a <plain>").back() == 514);
}

TEST_CASE("Metaspace pre-tokenizer and decoder (non-legacy sentencepiece files)") {
  // stories260K rewritten the way newer Llama/Mistral files are: no normalizer,
  // Metaspace(prepend_scheme "first") pre-tokenizer and decoder.
  llm::test::TempDir dir;
  nlohmann::json j = stories_json();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"}, {"split", false}};
  j["decoder"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"}, {"split", false}};
  llm::test::write_file(dir / "tokenizer.json", j.dump());
  const Tokenizer tok = Tokenizer::from_hf_dir(dir.path());
  const Tokenizer& legacy = stories_hf();
  CHECK(tok.kind() == TokenizerKind::sentencepiece_bpe);
  CHECK(tok.encode("Once upon a time") == legacy.encode("Once upon a time"));
  // No second "▁" before a leading space (legacy Prepend adds one regardless).
  CHECK(tok.encode(" Once") == legacy.encode("Once"));
  CHECK(legacy.encode(" Once") != legacy.encode("Once"));
  // "first": no prefix for text after a special token.
  const Ids once_upon = legacy.encode("Once upon");
  CHECK(tok.encode("<s>Once upon") != cat({1}, once_upon));
  CHECK(tok.decode(tok.encode("<s>Once upon")) == "<s>Once upon");
  CHECK(tok.decode(tok.encode("Once upon")) == "Once upon");
}

TEST_CASE("BOS/EOS/PAD from tokenizer_config, generation_config and config") {
  llm::test::TempDir dir;
  llm::test::write_file(dir / "tokenizer.json", stories_json().dump());
  SUBCASE("tokenizer.json alone: BOS from its post-processor template") {
    const Tokenizer tok = Tokenizer::from_hf_dir(dir.path());
    CHECK(tok.bos_id() == 1);
    CHECK(tok.add_bos());
    CHECK_FALSE(tok.eos_id().has_value());
    CHECK(tok.eog_ids() == Ids{2});  // "</s>" is a known end-of-turn token
  }
  SUBCASE("token objects, add_bos_token false, eos list in generation_config") {
    llm::test::write_file(dir / "tokenizer_config.json",
                          R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": null,
                              "pad_token": "<unk>", "add_bos_token": false})");
    llm::test::write_file(dir / "generation_config.json", R"({"eos_token_id": [2, 5]})");
    llm::test::write_file(dir / "config.json", R"({"eos_token_id": 7, "pad_token_id": 9})");
    const Tokenizer tok = Tokenizer::from_hf_dir(dir.path());
    CHECK(tok.bos_id() == 1);
    CHECK_FALSE(tok.add_bos());
    CHECK(tok.encode("Once", true) == tok.encode("Once"));
    CHECK(tok.eos_id() == 2);  // generation_config.json before config.json
    CHECK(tok.pad_id() == 0);  // tokenizer_config.json first
    CHECK(tok.eog_ids() == Ids{2, 5, 7});
  }
  SUBCASE("config.json as the last fallback") {
    llm::test::write_file(dir / "config.json", R"({"bos_token_id": 1, "eos_token_id": 4})");
    const Tokenizer tok = Tokenizer::from_hf_dir(dir.path());
    CHECK(tok.eos_id() == 4);
    CHECK(tok.eog_ids() == Ids{2, 4});
  }
  SUBCASE("a malformed config names the file") {
    llm::test::write_file(dir / "generation_config.json", "{ nope");
    const std::string msg = error_of([&] { Tokenizer::from_hf_dir(dir.path()); });
    CHECK(msg.find((dir / "generation_config.json").string()) != std::string::npos);
  }
}

TEST_CASE("a broken tokenizer.json gives an error naming the file and the problem") {
  llm::test::TempDir dir;
  const fs::path file = dir / "tokenizer.json";
  const auto error_for = [&](const std::string& content) {
    llm::test::write_file(file, content);
    return error_of([&] { Tokenizer::from_hf_dir(dir.path()); });
  };
  const auto check_error = [&](const std::string& msg, const std::string& what) {
    CAPTURE(msg);
    CHECK(msg.find(file.string()) != std::string::npos);
    CHECK(msg.find(what) != std::string::npos);
  };
  check_error(error_for(R"({"model": {"type": "BPE", "vocab": {)"), "malformed JSON");
  check_error(error_for(R"({"version": "1.0"})"), "no \"model\"");
  check_error(error_for(R"({"model": {"type": "Unigram", "vocab": []}})"), "Unigram");
  nlohmann::json j = stories_json();
  j["pre_tokenizer"] = {{"type", "WhitespaceSplit"}};
  check_error(error_for(j.dump()), "WhitespaceSplit");
  j = stories_json();
  j["normalizer"] = {{"type", "Lowercase"}};
  check_error(error_for(j.dump()), "Lowercase");
  j = stories_json();
  j["model"]["merges"].push_back("▁ nonexistent");
  check_error(error_for(j.dump()), "nonexistent");
  j = stories_json();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  check_error(error_for(j.dump()), "unclosed");

  const fs::path missing = dir / "no-such-model";
  const std::string msg = error_of([&] { Tokenizer::from_hf_dir(missing); });
  CHECK(msg.find((missing / "tokenizer.json").string()) != std::string::npos);
}

TEST_CASE("GGUF tokenizer metadata: errors and the pre-tokenizer fallback") {
  llm::test::TempDir dir;
  const fs::path file = dir / "vocab.gguf";
  // A byte-level vocab: the 256 alphabet characters and one merge.
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(llm::weights::byte_to_unicode(static_cast<uint8_t>(b)));
  tokens.push_back("Ġw");
  const auto write = [&](const std::string& model, const std::string& pre) {
    llm::weights::GgufWriter w;
    w.set_string("general.architecture", "qwen2");
    w.set_string("tokenizer.ggml.model", model);
    if (!pre.empty()) w.set_string("tokenizer.ggml.pre", pre);
    w.set_string_array("tokenizer.ggml.tokens", tokens);
    w.set_string_array("tokenizer.ggml.merges", {"Ġ w"});
    w.write(file);
  };

  write("gpt2", "some-future-model");
  const Tokenizer tok = Tokenizer::from_gguf(GgufFile(file));  // GPT-2 regex, with a warning
  CHECK(tok.encode(" w") == Ids{256});
  CHECK(tok.encode("w w") == Ids{'w', 256});
  CHECK_FALSE(tok.add_bos());  // the default for gpt2 vocabs

  write("bert", "default");
  std::string msg = error_of([&] { Tokenizer::from_gguf(GgufFile(file)); });
  CHECK(msg.find(file.string()) != std::string::npos);
  CHECK(msg.find("bert") != std::string::npos);

  llm::weights::GgufWriter empty;
  empty.set_string("general.architecture", "llama");
  empty.write(file);
  msg = error_of([&] { Tokenizer::from_gguf(GgufFile(file)); });
  CHECK(msg.find(file.string()) != std::string::npos);
  CHECK(msg.find("tokenizer.ggml.model") != std::string::npos);
}

TEST_CASE("pre-tokenizer regexes of the supported families") {
  using llm::weights::PreTokenizer;
  using llm::weights::SplitBehavior;
  const auto split = [](const PreTokenizer& pt, std::string_view text) {
    std::vector<llm::weights::Span> spans;
    pt.split(text, spans);
    std::vector<std::string> out;
    for (const auto& s : spans) out.emplace_back(text.substr(s.begin, s.size));
    return out;
  };
  using Pieces = std::vector<std::string>;
  PreTokenizer gpt2, llama3, qwen2;
  gpt2.add_split(llm::weights::kGpt2Pattern, false, SplitBehavior::isolated, false);
  llama3.add_split(llm::weights::kLlama3Pattern, false, SplitBehavior::isolated, false);
  qwen2.add_split(llm::weights::kQwen2Pattern, false, SplitBehavior::isolated, false);
  const std::string text = "Hello world's 12345  x\n";
  CHECK(split(gpt2, text) == Pieces{"Hello", " world", "'s", " 12345", " ", " x", "\n"});
  CHECK(split(llama3, text) == Pieces{"Hello", " world", "'s", " ", "123", "45", " ", " x", "\n"});
  CHECK(split(qwen2, text) == Pieces{"Hello", " world", "'s", " ", "1", "2", "3", "4", "5", " ", " x", "\n"});
  CHECK(split(qwen2, "I'VE") == Pieces{"I", "'VE"});  // case-insensitive contractions
  CHECK(split(gpt2, "I'VE") == Pieces{"I", "'", "VE"});

  // Hugging Face's documented example of the split behaviours.
  const std::vector<std::pair<SplitBehavior, Pieces>> behaviours = {
      {SplitBehavior::removed, {"the", "final", "countdown"}},
      {SplitBehavior::isolated, {"the", "-", "final", "-", "-", "countdown"}},
      {SplitBehavior::merged_with_previous, {"the-", "final-", "-", "countdown"}},
      {SplitBehavior::merged_with_next, {"the", "-final", "-", "-countdown"}},
      {SplitBehavior::contiguous, {"the", "-", "final", "--", "countdown"}},
  };
  for (const auto& [behaviour, expected] : behaviours) {
    PreTokenizer pt;
    pt.add_split("-", true, behaviour, false);
    CHECK(split(pt, "the-final--countdown") == expected);
  }
  PreTokenizer inverted;  // invert: the matches are the pieces' content
  inverted.add_split(R"(\p{L}+)", false, SplitBehavior::removed, true);
  CHECK(split(inverted, "the-final--countdown") == Pieces{"the", "final", "countdown"});

  PreTokenizer digits;  // HF Digits(individual_digits=true) on top of a split
  digits.add_split(R"(\s+)", false, SplitBehavior::removed, false);
  digits.add_split(R"(\p{N})", false, SplitBehavior::isolated, false);
  CHECK(split(digits, "ab12 c٣4") == Pieces{"ab", "1", "2", "c", "٣", "4"});
}

TEST_CASE("UTF-8 repair follows the maximal-subpart rule") {
  using llm::weights::to_valid_utf8;
  using llm::weights::utf8_incomplete_tail;
  // The Unicode standard's example (section 3.9, U+FFFD substitution).
  CHECK(to_valid_utf8("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64") ==
        "a\uFFFD\uFFFD\uFFFDb\uFFFDc\uFFFD\uFFFDd");
  CHECK(to_valid_utf8("\xED\xA0\x80") == "\uFFFD\uFFFD\uFFFD");  // a surrogate
  CHECK(to_valid_utf8("\xC0\xAF") == "\uFFFD\uFFFD");            // an overlong '/'
  CHECK(to_valid_utf8("ok 🦙") == "ok 🦙");
  CHECK(utf8_incomplete_tail("a\xF0\x9F") == 2);
  CHECK(utf8_incomplete_tail("a\xF0\x9F\xA6") == 3);
  CHECK(utf8_incomplete_tail("a\xF0\x9F\xA6\x99") == 0);
  CHECK(utf8_incomplete_tail("a\xE0\x80") == 0);  // can never become valid
  CHECK(utf8_incomplete_tail("\x80\x80") == 0);
}
