#pragma once
// Chat templates: renders OpenAI-style messages with the Jinja template the
// model ships (tokenizer_config.json "chat_template" or GGUF
// tokenizer.chat_template), through a Jinja subset interpreter (weights/jinja.h).
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace llm::weights {

class GgufFile;
namespace jinja { class Template; }

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", "tool"
  std::string content;
};

class ChatTemplateError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

class ChatTemplate {
 public:
  // Parses the template; throws ChatTemplateError on a syntax error or a
  // construct the interpreter does not support (with line and column).
  ChatTemplate(std::string source, std::string bos_token, std::string eos_token);
  // The template of a HF model dir (tokenizer_config.json) or a GGUF file;
  // models without one get fallback().
  static ChatTemplate from_hf_dir(const std::filesystem::path& dir, std::string bos_token,
                                  std::string eos_token);
  static ChatTemplate from_gguf(const GgufFile& gguf, std::string bos_token, std::string eos_token);
  // Documented plain format for models without a template:
  // "<role>: <content>\n" per message, then "assistant:" with add_generation_prompt.
  static ChatTemplate fallback();

  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

  // messages: array of {"role", "content", ...} objects as in the OpenAI API.
  // extra: additional variables visible to the template (e.g. "tools").
  // Throws ChatTemplateError for runtime errors (raise_exception, bad types).
  std::string render(const nlohmann::json& messages, bool add_generation_prompt,
                     const nlohmann::json& extra = nlohmann::json::object()) const;
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  const std::string& source() const { return source_; }
  bool is_fallback() const { return fallback_; }

 private:
  ChatTemplate() = default;
  std::string source_;
  std::string bos_token_, eos_token_;
  bool fallback_ = false;
  std::unique_ptr<jinja::Template> compiled_;
};

}  // namespace llm::weights
