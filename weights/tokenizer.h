#pragma once
// Tokenizers: byte-level BPE (GPT-2 / Qwen2 style) and sentencepiece-style BPE
// with byte fallback (Llama / Mistral / TinyLlama), loaded from a Hugging Face
// tokenizer.json or from GGUF metadata (tokenizer.ggml.*).
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace llm::weights {

class GgufFile;
struct TokenizerImpl;

enum class TokenizerKind { byte_level_bpe, sentencepiece_bpe };

class Tokenizer {
 public:
  // dir holds tokenizer.json (required) and optionally tokenizer_config.json,
  // generation_config.json and config.json (BOS/EOS/PAD, add_bos_token).
  static Tokenizer from_hf_dir(const std::filesystem::path& dir);
  static Tokenizer from_gguf(const GgufFile& gguf);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // add_special: prepend BOS when the model asks for it (add_bos_token).
  // parse_special: match added/special tokens (e.g. "<|im_start|>") in the text
  // before BPE; false treats them as plain text.
  std::vector<int32_t> encode(std::string_view text, bool add_special = false,
                              bool parse_special = true) const;
  // Like Hugging Face decode: SPM leading-space strip at the start, byte
  // fallback tokens fused, invalid UTF-8 replaced with U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // Raw bytes one token stands for in the middle of a text (no leading-space
  // strip): byte-level tokens mapped back to bytes, "▁" to " ", <0xAB> to the byte.
  // Special/control tokens give their text. Used by the incremental detokenizer.
  std::string token_bytes(int32_t id) const;
  std::string_view token_text(int32_t id) const;  // the vocab string as stored
  std::optional<int32_t> find_token(std::string_view text) const;

  TokenizerKind kind() const;
  int32_t n_vocab() const;  // vocab + added tokens (max id + 1)
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> pad_id() const;
  // Every id that ends generation: EOS, generation_config eos list, and known
  // end-of-turn tokens (<|im_end|>, <|endoftext|>, <|eot_id|>, <|end|>, </s>) present in the vocab.
  const std::vector<int32_t>& eog_ids() const;
  bool is_eog(int32_t id) const;
  bool is_special(int32_t id) const;  // control tokens (added tokens marked special)
  bool add_bos() const;
  std::string bos_text() const;  // "" when the model has none
  std::string eos_text() const;

 private:
  explicit Tokenizer(std::unique_ptr<TokenizerImpl> impl);
  std::unique_ptr<TokenizerImpl> impl_;
};

}  // namespace llm::weights
