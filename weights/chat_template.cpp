// Chat templates; see chat_template.h. Rendering follows transformers'
// apply_chat_template: the template sees messages, add_generation_prompt, the
// special tokens, tools and documents (None unless given) and any extra
// variables, in the Jinja environment weights/jinja.h implements.
#include "weights/chat_template.h"

#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>

#include "weights/gguf.h"
#include "weights/jinja.h"

namespace llm::weights {
namespace {

// The plain format documented in fallback(). Content that is not a string
// (null for tool-call turns, lists of multimodal parts) renders empty.
constexpr const char* kFallbackSource =
    "{% for message in messages %}"
    "{{ message.role }}: {{ message.content if message.content is string else '' }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}";

std::unique_ptr<jinja::Template> compile(const std::string& source) {
  std::unique_ptr<jinja::Template> compiled;
  try {
    compiled = std::make_unique<jinja::Template>(source);
  } catch (const jinja::Error& e) {
    throw ChatTemplateError(std::string("chat template: ") + e.what());
  }
  if (const auto& unknown = compiled->unknown_names(); !unknown.empty()) {
    std::string names;
    for (const auto& name : unknown) names += (names.empty() ? "" : ", ") + name;
    spdlog::warn("chat template uses {}, which this server lacks; requests that reach them will fail", names);
  }
  return compiled;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ChatTemplateError("cannot read " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// tokenizer_config.json's "chat_template": a string, or (for models with
// several) a list of {"name", "template"} of which "default" is the one
// transformers applies. nullopt when there is none.
std::optional<std::string> template_from_config(const std::filesystem::path& path) {
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::exception& e) {
    throw ChatTemplateError(path.string() + ": invalid JSON: " + e.what());
  }
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    std::string names;
    for (const auto& entry : *it) {
      const auto name = entry.find("name");
      const auto source = entry.find("template");
      if (!entry.is_object() || name == entry.end() || !name->is_string() || source == entry.end() ||
          !source->is_string()) {
        throw ChatTemplateError(path.string() +
                                ": chat_template entries must be {\"name\", \"template\"} strings");
      }
      if (*name == "default") return source->get<std::string>();
      names += (names.empty() ? "" : ", ") + name->get<std::string>();
    }
    throw ChatTemplateError(path.string() + ": no chat template named 'default' (found: " + names + ")");
  }
  throw ChatTemplateError(path.string() + ": chat_template must be a string or a list of named templates");
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source, std::string bos_token, std::string eos_token)
    : source_(std::move(source)),
      bos_token_(std::move(bos_token)),
      eos_token_(std::move(eos_token)),
      compiled_(compile(source_)) {}

ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

ChatTemplate ChatTemplate::from_hf_dir(const std::filesystem::path& dir, std::string bos_token,
                                       std::string eos_token) {
  // Recent transformers save the template beside the config, and that file wins.
  const auto jinja_file = dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja_file)) {
    return ChatTemplate(read_text(jinja_file), std::move(bos_token), std::move(eos_token));
  }
  const auto config = dir / "tokenizer_config.json";
  if (std::filesystem::exists(config)) {
    if (auto source = template_from_config(config)) {
      return ChatTemplate(std::move(*source), std::move(bos_token), std::move(eos_token));
    }
  }
  spdlog::warn("{}: the model ships no chat template; using the plain fallback format", dir.string());
  return fallback();
}

ChatTemplate ChatTemplate::from_gguf(const GgufFile& gguf, std::string bos_token, std::string eos_token) {
  if (auto source = gguf.get_string("tokenizer.chat_template")) {
    return ChatTemplate(std::move(*source), std::move(bos_token), std::move(eos_token));
  }
  spdlog::warn("{}: the model ships no chat template; using the plain fallback format", gguf.path().string());
  return fallback();
}

ChatTemplate ChatTemplate::fallback() {
  ChatTemplate t(kFallbackSource, "", "");
  t.fallback_ = true;
  return t;
}

std::string ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt,
                                 const nlohmann::json& extra) const {
  if (!messages.is_array()) throw ChatTemplateError("chat template: messages must be a JSON array");
  if (!extra.is_object() && !extra.is_null()) {
    throw ChatTemplateError("chat template: extra variables must be a JSON object");
  }
  // As transformers passes them: tools and documents are None unless given, a
  // special token the model lacks is left undefined, and extra variables
  // override the special tokens but not messages or add_generation_prompt.
  nlohmann::json context = {{"tools", nullptr}, {"documents", nullptr}};
  if (!bos_token_.empty()) context["bos_token"] = bos_token_;
  if (!eos_token_.empty()) context["eos_token"] = eos_token_;
  if (extra.is_object()) {
    for (const auto& [key, value] : extra.items()) context[key] = value;
  }
  context["messages"] = messages;
  context["add_generation_prompt"] = add_generation_prompt;
  try {
    return compiled_->render(context);
  } catch (const jinja::RaisedError& e) {
    throw ChatTemplateError(e.message());  // the template author's words, meant for the user
  } catch (const jinja::Error& e) {
    throw ChatTemplateError(std::string("chat template: ") + e.what());
  }
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  nlohmann::json array = nlohmann::json::array();
  for (const ChatMessage& m : messages) array.push_back({{"role", m.role}, {"content", m.content}});
  return render(array, add_generation_prompt);
}

}  // namespace llm::weights
