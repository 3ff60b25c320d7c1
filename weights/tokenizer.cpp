#include "weights/tokenizer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "weights/bpe.h"
#include "weights/gguf.h"
#include "weights/pretokenize.h"

namespace llm::weights {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Per-token flags.
enum TokenFlag : uint8_t {
  kSpecial = 1,  // control (or unknown) token: skipped by skip_special, matched only with parse_special
  kAdded = 2,    // matched as a whole before BPE and decoded as its raw text
  kByte = 4,     // byte-fallback token <0xAB>
  kUnused = 8,   // no token at this id, or GGUF "unused": decodes to nothing
};

// How a stretch of plain text becomes ids once normalised and split.
enum class ModelKind {
  byte_ranks,   // byte-level BPE: bytes -> alphabet tokens -> merges by rank
  char_ranks,   // sentencepiece-style HF BPE: characters (or their bytes) -> merges by rank
  char_scores,  // GGUF sentencepiece: characters -> merges by piece score
};

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581 "▁"
// End-of-turn tokens that end generation whatever the configs say.
constexpr std::string_view kEndOfTurnTokens[] = {"<|im_end|>", "<|endoftext|>", "<|eot_id|>",
                                                  "<|end|>", "</s>"};
// Guards against a corrupt file asking for a gigantic vocab allocation.
constexpr int64_t kMaxVocab = 16 * 1024 * 1024;

[[noreturn]] void fail(const fs::path& file, const std::string& what) {
  throw std::runtime_error(file.string() + ": " + what);
}

std::optional<int32_t> parse_byte_token(std::string_view text) {
  // "<0xAB>": sentencepiece's byte pieces.
  if (text.size() != 6 || !text.starts_with("<0x") || text[5] != '>') return std::nullopt;
  int value = 0;
  for (char c : text.substr(3, 2)) {
    value *= 16;
    if (c >= '0' && c <= '9') value += c - '0';
    else if (c >= 'A' && c <= 'F') value += c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') value += c - 'a' + 10;
    else return std::nullopt;
  }
  return value;
}

std::string replace_all(const std::string& s, std::string_view from, std::string_view to) {
  // Built into a new string: in-place replace() trips a GCC 12 -Wrestrict false positive.
  std::string out;
  out.reserve(s.size());
  size_t start = 0;
  for (size_t pos; (pos = s.find(from, start)) != std::string::npos; start = pos + from.size()) {
    out.append(s, start, pos - start);
    out.append(to);
  }
  out.append(s, start, std::string::npos);
  return out;
}

}  // namespace

struct TokenizerImpl {
  fs::path source;  // for messages
  TokenizerKind kind = TokenizerKind::byte_level_bpe;
  ModelKind model = ModelKind::byte_ranks;

  std::vector<std::string> texts;   // id -> vocab string as stored
  std::vector<std::string> pieces;  // id -> bytes it decodes to
  std::vector<uint8_t> flags;       // id -> TokenFlag bits
  TokenIndex index;                 // text -> id over texts

  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  AddedTokenMatcher added;
  RankBpe ranks;
  ScoreBpe scores;
  std::array<int32_t, 256> byte_ids{};  // byte-level: alphabet token; SPM: <0xAB> token; -1 none
  int32_t unk_id = -1;
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;  // a word that is a vocab token skips the merges (Llama 3)
  size_t n_strip_leading_spaces = 0;

  std::optional<int32_t> bos, eos, pad;
  std::vector<int32_t> eog;
  bool add_bos = false;

  struct Work {
    BpeWork bpe;
    std::vector<Span> spans;
    std::vector<int32_t> symbols;
  };

  int32_t n_vocab() const { return static_cast<int32_t>(texts.size()); }
  bool valid(int32_t id) const { return id >= 0 && id < n_vocab(); }
  bool has_flag(int32_t id, uint8_t f) const { return valid(id) && (flags[id] & f) != 0; }

  // A vocab token plain text may turn into: never an added or unused token,
  // so text can never smuggle in a control token.
  int32_t model_token(std::string_view text) const {
    const int32_t id = find_id(text);
    return id >= 0 && (flags[id] & (kAdded | kUnused)) == 0 ? id : -1;
  }
  int32_t find_id(std::string_view text) const { return index.find(text, texts); }

  void resize(size_t n) {
    texts.resize(n);
    flags.resize(n, kUnused);
  }

  // replace: this token wins over an earlier one with the same text.
  void set_token(int32_t id, std::string text, uint8_t f, bool replace = false) {
    flags[id] = f;
    texts[id] = std::move(text);
    index.insert(id, texts, replace);
  }

  void encode_text(std::string_view text, bool at_input_start, std::vector<int32_t>& out, Work& w) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out, Work& w) const;
  void finish();
};

// ---- Encoding --------------------------------------------------------------------

void TokenizerImpl::encode_text(std::string_view text, bool at_input_start, std::vector<int32_t>& out,
                                Work& w) const {
  std::string normalized = normalizer.empty() ? std::string(text) : normalizer.apply(text, at_input_start);
  if (pre_tokenizer.prefix_space() && !normalized.empty() && normalized[0] != ' ') {
    normalized.insert(0, 1, ' ');
  }
  pre_tokenizer.split(normalized, w.spans);
  for (const Span& s : w.spans) encode_word(std::string_view(normalized).substr(s.begin, s.size), out, w);
}

void TokenizerImpl::encode_word(std::string_view word, std::vector<int32_t>& out, Work& w) const {
  if (model == ModelKind::char_scores) {
    scores.encode(word, byte_ids, unk_id, out, w.bpe);
    return;
  }
  auto& symbols = w.symbols;
  symbols.clear();
  if (model == ModelKind::byte_ranks) {
    if (ignore_merges) {
      std::string mapped;
      for (char c : word) mapped += byte_to_unicode(static_cast<uint8_t>(c));
      if (const int32_t id = model_token(mapped); id >= 0) {
        out.push_back(id);
        return;
      }
    }
    for (char c : word) {
      const int32_t id = byte_ids[static_cast<uint8_t>(c)];
      if (id >= 0) symbols.push_back(id);
      else if (unk_id >= 0) symbols.push_back(unk_id);
    }
  } else {
    // Hugging Face BPE: each character is a symbol; one missing from the vocab
    // becomes its byte tokens, else <unk> (consecutive ones fused if asked).
    bool previous_unk = false;
    for (size_t pos = 0; pos < word.size();) {
      const size_t len = std::max<size_t>(utf8_valid_length(word.substr(pos)), 1);
      const std::string_view ch = word.substr(pos, len);
      pos += len;
      if (const int32_t id = model_token(ch); id >= 0) {
        symbols.push_back(id);
        previous_unk = false;
        continue;
      }
      if (byte_fallback && std::all_of(ch.begin(), ch.end(),
                                       [&](char b) { return byte_ids[static_cast<uint8_t>(b)] >= 0; })) {
        for (char b : ch) symbols.push_back(byte_ids[static_cast<uint8_t>(b)]);
        previous_unk = false;
        continue;
      }
      if (unk_id < 0) continue;  // HF drops it too when the model has no <unk>
      if (!(fuse_unk && previous_unk)) symbols.push_back(unk_id);
      previous_unk = true;
    }
  }
  ranks.apply(symbols, w.bpe);
  out.insert(out.end(), symbols.begin(), symbols.end());
}

// Derives what the loaders leave implicit: decoded pieces, eog ids, checks.
void TokenizerImpl::finish() {
  pieces.assign(texts.size(), std::string());
  for (size_t id = 0; id < texts.size(); ++id) {
    const std::string& text = texts[id];
    const uint8_t f = flags[id];
    if ((f & kUnused) != 0) continue;
    if ((f & kAdded) != 0) {
      pieces[id] = text;
    } else if ((f & kByte) != 0) {
      pieces[id] = std::string(1, static_cast<char>(*parse_byte_token(text)));
    } else if (kind == TokenizerKind::byte_level_bpe) {
      pieces[id] = unicode_to_bytes(text).value_or(text);
    } else {
      pieces[id] = replace_all(text, kMetaspace, " ");
    }
  }

  if (eos) eog.push_back(*eos);
  for (std::string_view name : kEndOfTurnTokens) {
    const int32_t id = find_id(name);
    if (id >= 0 && (flags[id] & kAdded) != 0) eog.push_back(id);
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());

  if (add_bos && !bos) {
    spdlog::warn("{}: the tokenizer asks for a BOS token but defines none; not adding one",
                 source.string());
    add_bos = false;
  }
}

// ---- Hugging Face tokenizer.json -------------------------------------------------

namespace {

std::optional<json> read_json(const fs::path& path, bool required) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!required && !fs::exists(path)) return std::nullopt;
    fail(path, fs::exists(path) ? "cannot read the file" : "file not found");
  }
  // Parsing from memory is markedly faster than from the stream.
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) fail(path, "read error");
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    fail(path, std::string("malformed JSON: ") + e.what());
  }
}

std::string type_of(const json& j, const char* what) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    throw std::runtime_error(std::string(what) + " without a \"type\"");
  }
  return j["type"].get<std::string>();
}

// HF patterns are {"String": "..."} or {"Regex": "..."}.
std::pair<std::string, bool> parse_pattern(const json& p) {
  if (p.contains("Regex")) return {p["Regex"].get<std::string>(), true};
  if (p.contains("String")) return {p["String"].get<std::string>(), false};
  throw std::runtime_error("pattern is neither String nor Regex: " + p.dump());
}

Normalizer::PrependScheme parse_prepend_scheme(const json& j) {
  if (j.contains("prepend_scheme")) {
    const auto s = j["prepend_scheme"].get<std::string>();
    if (s == "always") return Normalizer::PrependScheme::always;
    if (s == "first") return Normalizer::PrependScheme::first;
    if (s == "never") return Normalizer::PrependScheme::never;
    throw std::runtime_error("unknown Metaspace prepend_scheme '" + s + "'");
  }
  // Older files: add_prefix_space (default true).
  return j.value("add_prefix_space", true) ? Normalizer::PrependScheme::always
                                           : Normalizer::PrependScheme::never;
}

class HfLoader {
 public:
  HfLoader(TokenizerImpl& t, fs::path file) : t_(t), file_(std::move(file)) {}

  void load(const json& root);

 private:
  void parse_model(const json& model);
  void parse_added_tokens(const json& added);
  void parse_normalizer(const json& j);
  void parse_pre_tokenizer(const json& j);
  void parse_decoder(const json& j);

  TokenizerImpl& t_;
  fs::path file_;
  bool byte_level_ = false;        // a ByteLevel pre-tokenizer or decoder was seen
  bool after_byte_level_ = false;  // a ByteLevel pre-tokenizer already ran
};

void HfLoader::load(const json& root) {
  if (!root.is_object()) fail(file_, "not a tokenizer.json object");
  if (!root.contains("model") || !root["model"].is_object()) fail(file_, "no \"model\" section");
  try {
    parse_model(root["model"]);
    if (root.contains("added_tokens")) parse_added_tokens(root["added_tokens"]);
    if (root.contains("normalizer")) parse_normalizer(root["normalizer"]);
    if (root.contains("pre_tokenizer")) parse_pre_tokenizer(root["pre_tokenizer"]);
    if (root.contains("decoder")) parse_decoder(root["decoder"]);
  } catch (const json::exception& e) {
    fail(file_, std::string("unexpected structure: ") + e.what());
  } catch (const std::invalid_argument& e) {  // bad regex
    fail(file_, e.what());
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    if (what.starts_with(file_.string())) throw;
    fail(file_, what);
  }
  t_.kind = byte_level_ ? TokenizerKind::byte_level_bpe : TokenizerKind::sentencepiece_bpe;
  t_.model = byte_level_ ? ModelKind::byte_ranks : ModelKind::char_ranks;
  t_.byte_ids.fill(-1);
  for (int b = 0; b < 256; ++b) {
    if (byte_level_) {
      t_.byte_ids[b] = t_.model_token(byte_to_unicode(static_cast<uint8_t>(b)));
    } else if (t_.byte_fallback) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      t_.byte_ids[b] = t_.model_token(name);
    }
  }
}

void HfLoader::parse_model(const json& model) {
  const std::string type = model.value("type", model.contains("merges") ? "BPE" : "");
  if (type != "BPE") {
    throw std::runtime_error("unsupported model type '" + type + "' (only BPE is supported)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty()) {
      throw std::runtime_error(std::string("unsupported BPE option ") + key);
    }
  }
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    throw std::runtime_error("BPE model without a vocab");
  }
  const json& vocab = model["vocab"];
  t_.texts.reserve(vocab.size());
  t_.flags.reserve(vocab.size());
  t_.index.reserve(vocab.size() + 1024, t_.texts);
  t_.byte_fallback = model.value("byte_fallback", false);
  for (const auto& [text, id_json] : vocab.items()) {
    const auto id = id_json.get<int64_t>();
    if (id < 0 || id >= kMaxVocab) throw std::runtime_error("implausible id " + std::to_string(id) + " for '" + text + "'");
    if (id >= t_.n_vocab()) t_.resize(static_cast<size_t>(id + 1));
    const bool is_byte = t_.byte_fallback && parse_byte_token(text).has_value();
    t_.set_token(static_cast<int32_t>(id), text, is_byte ? kByte : 0);
  }

  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const auto unk = model["unk_token"].get<std::string>();
    t_.unk_id = t_.find_id(unk);
    if (t_.unk_id < 0) throw std::runtime_error("unk_token '" + unk + "' not in the vocab");
  }
  t_.fuse_unk = model.value("fuse_unk", false);
  t_.ignore_merges = model.value("ignore_merges", false);

  const json& merges = model.contains("merges") ? model["merges"] : json::array();
  t_.ranks.reserve(merges.size());
  for (const json& m : merges) {
    std::string left, right;
    if (m.is_string()) {  // "left right"
      const auto& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) throw std::runtime_error("bad merge '" + s + "'");
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else {  // ["left", "right"]
      left = m.at(0).get<std::string>();
      right = m.at(1).get<std::string>();
    }
    const int32_t l = t_.find_id(left);
    const int32_t r = t_.find_id(right);
    const int32_t joined = t_.find_id(left + right);
    if (l < 0 || r < 0 || joined < 0) {
      throw std::runtime_error("merge '" + left + " " + right + "' uses a token not in the vocab");
    }
    t_.ranks.add_merge(l, r, joined);
  }
}

void HfLoader::parse_added_tokens(const json& added) {
  for (const json& a : added) {
    AddedToken tok;
    const auto id = a.at("id").get<int64_t>();
    tok.content = a.at("content").get<std::string>();
    tok.special = a.value("special", false);
    tok.lstrip = a.value("lstrip", false);
    tok.rstrip = a.value("rstrip", false);
    tok.single_word = a.value("single_word", false);
    if (id < 0 || id >= kMaxVocab) {
      throw std::runtime_error("implausible id " + std::to_string(id) + " for added token '" + tok.content + "'");
    }
    tok.id = static_cast<int32_t>(id);
    if (tok.id >= t_.n_vocab()) t_.resize(static_cast<size_t>(tok.id) + 1);
    // Added tokens win over a model token of the same text.
    t_.set_token(tok.id, tok.content, static_cast<uint8_t>(kAdded | (tok.special ? kSpecial : 0)), true);
    t_.added.add(std::move(tok));
  }
}

void HfLoader::parse_normalizer(const json& j) {
  if (j.is_null()) return;
  const std::string type = type_of(j, "normalizer");
  if (type == "Sequence") {
    for (const json& n : j.at("normalizers")) parse_normalizer(n);
  } else if (type == "NFC") {
    t_.normalizer.add_unicode(UnicodeForm::nfc);
  } else if (type == "NFD") {
    t_.normalizer.add_unicode(UnicodeForm::nfd);
  } else if (type == "NFKC") {
    t_.normalizer.add_unicode(UnicodeForm::nfkc);
  } else if (type == "NFKD") {
    t_.normalizer.add_unicode(UnicodeForm::nfkd);
  } else if (type == "Prepend") {
    t_.normalizer.add_prepend(j.at("prepend").get<std::string>());
  } else if (type == "Replace") {
    const auto [pattern, regex] = parse_pattern(j.at("pattern"));
    t_.normalizer.add_replace(pattern, j.at("content").get<std::string>(), regex);
  } else {
    throw std::runtime_error("unsupported normalizer type '" + type + "'");
  }
}

SplitBehavior parse_behavior(const std::string& s) {
  if (s == "Removed") return SplitBehavior::removed;
  if (s == "Isolated") return SplitBehavior::isolated;
  if (s == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (s == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (s == "Contiguous") return SplitBehavior::contiguous;
  throw std::runtime_error("unknown Split behavior '" + s + "'");
}

void HfLoader::parse_pre_tokenizer(const json& j) {
  if (j.is_null()) return;
  const std::string type = type_of(j, "pre_tokenizer");
  if (type == "Sequence") {
    for (const json& p : j.at("pretokenizers")) parse_pre_tokenizer(p);
    return;
  }
  // ByteLevel maps bytes to its alphabet, which we do inside the model, so a
  // step after it would see different text than in Hugging Face.
  if (after_byte_level_) {
    throw std::runtime_error("unsupported pre_tokenizer: " + type + " after ByteLevel");
  }
  auto& pt = t_.pre_tokenizer;
  if (type == "Split") {
    const auto [pattern, regex] = parse_pattern(j.at("pattern"));
    pt.add_split(pattern, !regex, parse_behavior(j.at("behavior").get<std::string>()),
                 j.value("invert", false));
  } else if (type == "Digits") {
    pt.add_split(j.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)", false,
                 SplitBehavior::isolated, false);
  } else if (type == "ByteLevel") {
    if (j.value("add_prefix_space", false)) {
      if (pt.has_steps()) throw std::runtime_error("unsupported ByteLevel add_prefix_space after a split");
      pt.set_prefix_space(true);
    }
    if (j.value("use_regex", true)) pt.add_split(kGpt2Pattern, false, SplitBehavior::isolated, false);
    byte_level_ = true;
    after_byte_level_ = true;
  } else if (type == "Metaspace") {
    // Its space replacement and prefix are text edits, done as normalisation;
    // that is only equivalent when no split comes before it.
    if (pt.has_steps()) throw std::runtime_error("unsupported Metaspace after a split");
    const std::string replacement = j.value("replacement", std::string(kMetaspace));
    t_.normalizer.add_replace(" ", replacement, false);
    t_.normalizer.add_metaspace_prefix(replacement, parse_prepend_scheme(j));
    if (j.value("split", true)) pt.add_split(replacement, true, SplitBehavior::merged_with_next, false);
  } else {
    throw std::runtime_error("unsupported pre_tokenizer type '" + type + "'");
  }
}

void HfLoader::parse_decoder(const json& j) {
  if (j.is_null()) return;
  const std::string type = type_of(j, "decoder");
  if (type == "Sequence") {
    for (const json& d : j.at("decoders")) parse_decoder(d);
  } else if (type == "ByteLevel") {
    byte_level_ = true;
  } else if (type == "ByteFallback" || type == "Fuse") {
    // What our decode always does: byte tokens are bytes, pieces are joined.
  } else if (type == "Replace") {
    const auto [pattern, regex] = parse_pattern(j.at("pattern"));
    if (regex || pattern != kMetaspace || j.at("content").get<std::string>() != " ") {
      throw std::runtime_error("unsupported decoder Replace other than \"▁\" -> \" \"");
    }
  } else if (type == "Strip") {
    if (j.value("content", " ") != " " || j.value("stop", 0) != 0) {
      throw std::runtime_error("unsupported decoder Strip other than leading spaces");
    }
    t_.n_strip_leading_spaces = j.value("start", 0);
  } else if (type == "Metaspace") {
    t_.n_strip_leading_spaces = parse_prepend_scheme(j) == Normalizer::PrependScheme::never ? 0 : 1;
  } else {
    throw std::runtime_error("unsupported decoder type '" + type + "'");
  }
}

// The special token the post-processor puts before a single sequence (the
// BOS a tokenizer.json adds on its own), if any.
std::optional<std::string> template_prefix_token(const json& post) {
  if (!post.is_object()) return std::nullopt;
  const std::string type = post.value("type", "");
  if (type == "Sequence" && post.contains("processors")) {
    for (const json& p : post["processors"]) {
      if (auto token = template_prefix_token(p)) return token;
    }
    return std::nullopt;
  }
  if (type != "TemplateProcessing" || !post.contains("single") || post["single"].empty()) return std::nullopt;
  const json& first = post["single"][0];
  if (!first.contains("SpecialToken") || !first["SpecialToken"].contains("id") ||
      !first["SpecialToken"]["id"].is_string()) {
    return std::nullopt;
  }
  return first["SpecialToken"]["id"].get<std::string>();
}

// ---- BOS / EOS / PAD from the configs beside tokenizer.json ----------------------

// bos_token & co. are a string, an AddedToken object {"content": ...} or null.
std::optional<std::string> token_field(const json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

// *_token_id: an integer or a list of them.
std::vector<int64_t> id_field(const json& config, const char* key) {
  std::vector<int64_t> ids;
  if (!config.contains(key)) return ids;
  const json& v = config[key];
  if (v.is_number_integer()) ids.push_back(v.get<int64_t>());
  if (v.is_array()) {
    for (const json& e : v) {
      if (e.is_number_integer()) ids.push_back(e.get<int64_t>());
    }
  }
  return ids;
}

void load_special_ids(TokenizerImpl& t, const fs::path& dir, const json& post_processor) {
  const fs::path tc_path = dir / "tokenizer_config.json";
  const fs::path gc_path = dir / "generation_config.json";
  const fs::path cfg_path = dir / "config.json";
  const json tc = read_json(tc_path, false).value_or(json::object());
  const json gc = read_json(gc_path, false).value_or(json::object());
  const json cfg = read_json(cfg_path, false).value_or(json::object());

  const auto checked = [&](int64_t id, const fs::path& file, const char* key) -> std::optional<int32_t> {
    if (id >= 0 && id < t.n_vocab()) return static_cast<int32_t>(id);
    spdlog::warn("{}: {} {} is outside the vocab; ignored", file.string(), key, id);
    return std::nullopt;
  };
  // tokenizer_config.json names the token; generation_config.json, then
  // config.json, give ids. An explicit null counts as "not given" (as
  // llama.cpp's converter reads them), so both formats of a model agree.
  const auto resolve = [&](const char* token_key, const char* id_key) -> std::optional<int32_t> {
    if (const auto text = token_field(tc, token_key)) {
      if (const int32_t id = t.find_id(*text); id >= 0) return id;
      spdlog::warn("{}: {} '{}' is not in the vocab; ignored", tc_path.string(), token_key, *text);
    }
    for (const auto& [config, path] : {std::pair{&gc, &gc_path}, std::pair{&cfg, &cfg_path}}) {
      const auto ids = id_field(*config, id_key);
      if (!ids.empty()) return checked(ids.front(), *path, id_key);
    }
    return std::nullopt;
  };
  t.bos = resolve("bos_token", "bos_token_id");
  t.eos = resolve("eos_token", "eos_token_id");
  t.pad = resolve("pad_token", "pad_token_id");
  for (const auto& [config, path] : {std::pair{&gc, &gc_path}, std::pair{&cfg, &cfg_path}}) {
    for (int64_t id : id_field(*config, "eos_token_id")) {
      if (const auto ok = checked(id, *path, "eos_token_id")) t.eog.push_back(*ok);
    }
  }

  // Without add_bos_token, do what tokenizer.json alone does: add the token
  // its post-processor template starts with.
  const auto prefix = template_prefix_token(post_processor);
  const int32_t prefix_id = prefix ? t.find_id(*prefix) : -1;
  if (!t.bos && prefix_id >= 0) t.bos = prefix_id;
  if (tc.contains("add_bos_token") && tc["add_bos_token"].is_boolean()) {
    t.add_bos = tc["add_bos_token"].get<bool>();
  } else {
    t.add_bos = t.bos && prefix_id == *t.bos;
  }
}

// ---- GGUF (tokenizer.ggml.*) -----------------------------------------------------

struct GgufPre {
  std::string_view pattern;
  bool nfc = false;
  bool ignore_merges = false;
};

// The pre-tokenizer a "gpt2" vocab was trained with, by tokenizer.ggml.pre.
// Qwen2's NFC is applied too (llama.cpp skips it), so the GGUF and the
// Hugging Face files of one model tokenize alike.
std::optional<GgufPre> gguf_pre_tokenizer(std::string_view pre) {
  if (pre == "qwen2" || pre == "deepseek-r1-qwen") return GgufPre{kQwen2Pattern, true, false};
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") return GgufPre{kLlama3Pattern, false, true};
  if (pre == "smaug-bpe") return GgufPre{kLlama3Pattern, false, false};
  if (pre == "gpt-2" || pre == "gpt2" || pre == "default") return GgufPre{kGpt2Pattern, false, false};
  return std::nullopt;
}

void load_gguf_vocab(TokenizerImpl& t, const GgufFile& g) {
  const fs::path& file = g.path();
  const auto model = g.get_string("tokenizer.ggml.model");
  if (!model) fail(file, "no tokenizer.ggml.model (the file carries no tokenizer)");
  if (*model != "llama" && *model != "gpt2") {
    fail(file, "unsupported tokenizer.ggml.model '" + *model + "' (supported: llama, gpt2)");
  }
  const bool spm = *model == "llama";
  auto tokens = g.get_string_array("tokenizer.ggml.tokens");
  if (!tokens || tokens->empty()) fail(file, "no tokenizer.ggml.tokens");
  const size_t n = tokens->size();
  if (n >= static_cast<size_t>(kMaxVocab)) fail(file, "implausible vocab size " + std::to_string(n));
  const auto types = g.get_int_array("tokenizer.ggml.token_type");
  if (types && types->size() != n) {
    fail(file, "tokenizer.ggml.token_type has " + std::to_string(types->size()) + " entries for " +
                   std::to_string(n) + " tokens");
  }

  t.resize(n);
  t.index.reserve(n, t.texts);
  t.byte_ids.fill(-1);
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    std::string& text = (*tokens)[i];
    // 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    int64_t type = types ? (*types)[i] : 1;
    if (!types && spm && parse_byte_token(text)) type = 6;
    uint8_t f = 0;
    switch (type) {
      case 2:
        if (t.unk_id < 0) t.unk_id = id;
        f = kSpecial | kAdded;
        break;
      case 3: f = kSpecial | kAdded; break;
      case 4: f = kAdded; break;
      case 5: f = kUnused; break;
      case 6: {
        const auto byte = parse_byte_token(text);
        if (!byte) fail(file, "byte token " + std::to_string(i) + " '" + text + "' is not <0xAB>");
        if (t.byte_ids[*byte] < 0) t.byte_ids[*byte] = id;
        f = kByte;
        break;
      }
      default: break;
    }
    if ((f & kAdded) != 0) t.added.add({text, id, (f & kSpecial) != 0});
    t.set_token(id, std::move(text), f);
  }
  if (const auto unk = g.get_int("tokenizer.ggml.unknown_token_id"); unk && *unk >= 0 && *unk < t.n_vocab()) {
    t.unk_id = static_cast<int32_t>(*unk);
  }

  if (spm) {
    const auto scores = g.get_float_array("tokenizer.ggml.scores");
    if (scores && scores->size() != n) fail(file, "tokenizer.ggml.scores does not match the tokens");
    for (size_t i = 0; i < n; ++i) {
      if (t.flags[i] == 0) t.scores.add_piece(t.texts[i], static_cast<int32_t>(i), scores ? (*scores)[i] : 0.0f);
    }
    // llama.cpp: a space before every stretch of text (add_space_prefix),
    // spaces as U+2581, and one leading space dropped again when decoding.
    const bool space_prefix = g.get_bool("tokenizer.ggml.add_space_prefix").value_or(true);
    if (space_prefix) t.normalizer.add_prepend(std::string(kMetaspace));
    t.normalizer.add_replace(" ", std::string(kMetaspace), false);
    t.n_strip_leading_spaces = space_prefix ? 1 : 0;
    t.kind = TokenizerKind::sentencepiece_bpe;
    t.model = ModelKind::char_scores;
    return;
  }

  const auto merges = g.get_string_array("tokenizer.ggml.merges");
  if (!merges) fail(file, "gpt2 tokenizer without tokenizer.ggml.merges");
  t.ranks.reserve(merges->size());
  size_t n_skipped = 0;
  for (const std::string& m : *merges) {
    const size_t space = m.find(' ');
    const std::string_view left = std::string_view(m).substr(0, space);
    const std::string_view right = space == std::string::npos ? "" : std::string_view(m).substr(space + 1);
    const int32_t l = t.model_token(left);
    const int32_t r = t.model_token(right);
    const int32_t joined = t.model_token(std::string(left) + std::string(right));
    if (l < 0 || r < 0 || joined < 0) {
      ++n_skipped;
      continue;
    }
    t.ranks.add_merge(l, r, joined);
  }
  if (n_skipped > 0) {
    spdlog::warn("{}: {} merges name tokens missing from the vocab; ignored", file.string(), n_skipped);
  }

  const std::string pre = g.get_string("tokenizer.ggml.pre").value_or("");
  auto spec = gguf_pre_tokenizer(pre);
  if (!spec) {
    spdlog::warn("{}: unknown tokenizer.ggml.pre '{}'; splitting with the GPT-2 regex, which may "
                 "tokenize differently from the original model", file.string(), pre);
    spec = gguf_pre_tokenizer("gpt-2");
  }
  if (spec->nfc) t.normalizer.add_unicode(UnicodeForm::nfc);
  t.pre_tokenizer.add_split(spec->pattern, false, SplitBehavior::isolated, false);
  t.ignore_merges = spec->ignore_merges;
  for (int b = 0; b < 256; ++b) t.byte_ids[b] = t.model_token(byte_to_unicode(static_cast<uint8_t>(b)));
  t.kind = TokenizerKind::byte_level_bpe;
  t.model = ModelKind::byte_ranks;
}

void load_gguf_special_ids(TokenizerImpl& t, const GgufFile& g) {
  const bool spm = t.kind == TokenizerKind::sentencepiece_bpe;
  const auto id_of = [&](const char* key) -> std::optional<int32_t> {
    const auto v = g.get_int(key);
    if (!v) return std::nullopt;
    if (*v >= 0 && *v < t.n_vocab()) return static_cast<int32_t>(*v);
    spdlog::warn("{}: {} = {} is outside the vocab; ignored", g.path().string(), key, *v);
    return std::nullopt;
  };
  t.bos = id_of("tokenizer.ggml.bos_token_id");
  t.eos = id_of("tokenizer.ggml.eos_token_id");
  t.pad = id_of("tokenizer.ggml.padding_token_id");
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    if (const auto id = id_of(key)) t.eog.push_back(*id);
  }
  t.add_bos = g.get_bool("tokenizer.ggml.add_bos_token").value_or(spm);
}

}  // namespace

// ---- Tokenizer --------------------------------------------------------------------

Tokenizer::Tokenizer(std::unique_ptr<TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_hf_dir(const fs::path& dir) {
  const fs::path file = dir / "tokenizer.json";
  auto impl = std::make_unique<TokenizerImpl>();
  impl->source = file;
  const json root = *read_json(file, true);
  HfLoader(*impl, file).load(root);
  try {
    load_special_ids(*impl, dir, root.contains("post_processor") ? root["post_processor"] : json());
  } catch (const json::exception& e) {
    fail(file, std::string("unexpected post_processor: ") + e.what());
  }
  impl->finish();
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_gguf(const GgufFile& gguf) {
  auto impl = std::make_unique<TokenizerImpl>();
  impl->source = gguf.path();
  try {
    load_gguf_vocab(*impl, gguf);
    load_gguf_special_ids(*impl, gguf);
  } catch (const std::invalid_argument& e) {
    fail(gguf.path(), e.what());
  } catch (const std::runtime_error& e) {
    // The metadata getters report type mismatches without the file name.
    if (std::string_view(e.what()).find(gguf.path().string()) != std::string_view::npos) throw;
    fail(gguf.path(), e.what());
  }
  impl->finish();
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  const TokenizerImpl& t = *impl_;
  // The regexes need valid UTF-8; broken input is repaired (U+FFFD) rather
  // than rejected, as a tokenizer fed user text must not fail.
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = to_valid_utf8(text);
    text = repaired;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_special && t.add_bos) out.push_back(*t.bos);

  std::vector<Fragment> fragments;
  t.added.split(text, parse_special, fragments);
  TokenizerImpl::Work work;
  for (const Fragment& f : fragments) {
    if (f.token >= 0) {
      out.push_back(f.token);
    } else {
      t.encode_text(text.substr(f.text.begin, f.text.size), f.text.begin == 0, out, work);
    }
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const TokenizerImpl& t = *impl_;
  std::string bytes;
  for (int32_t id : ids) {
    // Ids outside the vocab (a model's padded embedding rows) decode to
    // nothing, as in Hugging Face, rather than failing a whole response.
    if (!t.valid(id) || (skip_special && t.has_flag(id, kSpecial))) continue;
    bytes += t.pieces[id];
  }
  size_t n_strip = 0;
  while (n_strip < t.n_strip_leading_spaces && n_strip < bytes.size() && bytes[n_strip] == ' ') ++n_strip;
  return to_valid_utf8(std::string_view(bytes).substr(n_strip));
}

std::string Tokenizer::token_bytes(int32_t id) const {
  return impl_->valid(id) ? impl_->pieces[id] : std::string();
}

std::string_view Tokenizer::token_text(int32_t id) const {
  return impl_->valid(id) ? std::string_view(impl_->texts[id]) : std::string_view();
}

std::optional<int32_t> Tokenizer::find_token(std::string_view text) const {
  const int32_t id = impl_->find_id(text);
  if (id < 0) return std::nullopt;
  return id;
}

TokenizerKind Tokenizer::kind() const { return impl_->kind; }
int32_t Tokenizer::n_vocab() const { return impl_->n_vocab(); }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
std::optional<int32_t> Tokenizer::pad_id() const { return impl_->pad; }
const std::vector<int32_t>& Tokenizer::eog_ids() const { return impl_->eog; }

bool Tokenizer::is_eog(int32_t id) const {
  return std::binary_search(impl_->eog.begin(), impl_->eog.end(), id);
}

bool Tokenizer::is_special(int32_t id) const { return impl_->has_flag(id, kSpecial); }
bool Tokenizer::add_bos() const { return impl_->add_bos; }

std::string Tokenizer::bos_text() const {
  return impl_->bos ? impl_->texts[*impl_->bos] : std::string();
}

std::string Tokenizer::eos_text() const {
  return impl_->eos ? impl_->texts[*impl_->eos] : std::string();
}

}  // namespace llm::weights
