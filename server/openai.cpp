#include "server/openai.h"

#include <nlohmann/json.hpp>

#include <random>

#include "server/api_error.h"

namespace llm::server {

using json = nlohmann::json;

namespace {

const char* type_name(const json& v) { return v.type_name(); }

// Each getter returns nullopt for an absent or null field and throws a 400
// naming the field when the type is wrong.
std::optional<double> get_number(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) {
    throw bad_request(std::string("'") + key + "' must be a number, not " + type_name(*it), key);
  }
  return it->get<double>();
}

std::optional<int64_t> get_int(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_number_float() && it->get<double>() == static_cast<double>(static_cast<int64_t>(it->get<double>()))) {
    return static_cast<int64_t>(it->get<double>());  // 16.0 is accepted as 16, as Python clients may send it
  }
  throw bad_request(std::string("'") + key + "' must be an integer, not " + type_name(*it), key);
}

std::optional<bool> get_bool(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) throw bad_request(std::string("'") + key + "' must be true or false", key);
  return it->get<bool>();
}

std::optional<std::string> get_string(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) throw bad_request(std::string("'") + key + "' must be a string, not " + type_name(*it), key);
  return it->get<std::string>();
}

float in_range(double v, double lo, double hi, const char* key) {
  if (!(v >= lo && v <= hi)) {
    throw bad_request(std::string("'") + key + "' must be between " + json(lo).dump() + " and " + json(hi).dump(), key);
  }
  return static_cast<float>(v);
}

std::vector<int32_t> token_array(const json& arr, const char* key, int64_t n_vocab) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (const json& t : arr) {
    if (!t.is_number_integer()) throw bad_request(std::string("'") + key + "' must hold token ids (integers)", key);
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id >= n_vocab) {
      throw bad_request(std::string("'") + key + "' holds token " + std::to_string(id) +
                            ", outside the vocabulary of " + std::to_string(n_vocab),
                        key);
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// OpenAI content: a string, or an array of parts of which we read the text ones.
std::string message_content(const json& m, const std::string& role, size_t index) {
  const std::string param = "messages[" + std::to_string(index) + "].content";
  const auto it = m.find("content");
  if (it == m.end() || it->is_null()) {
    // Only an assistant turn that made tool calls may come without content.
    if (role == "assistant") return {};
    throw bad_request("'" + param + "' is required for " + role + " messages", param);
  }
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    std::string text;
    for (const json& part : *it) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string()) {
        throw bad_request("only text content parts are supported in " + param, param);
      }
      text += part["text"].get<std::string>();
    }
    return text;
  }
  throw bad_request("'" + param + "' must be a string or an array of text parts", param);
}

json normalized_messages(const json& body) {
  const auto it = body.find("messages");
  if (it == body.end()) throw bad_request("'messages' is required", "messages");
  if (!it->is_array()) throw bad_request("'messages' must be an array of messages", "messages");
  if (it->empty()) throw bad_request("'messages' must not be empty", "messages");
  json out = json::array();
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw bad_request("'" + param + "' must be an object", param);
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string()) throw bad_request("'" + param + ".role' must be a string", param + ".role");
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";  // OpenAI's newer name for the system role
    if (r != "system" && r != "user" && r != "assistant" && r != "tool") {
      throw bad_request("'" + param + ".role' must be system, user, assistant or tool, not '" + r + "'", param + ".role");
    }
    json copy = m;  // keeps tool_calls, name, ... for templates that use them
    copy["role"] = r;
    copy["content"] = message_content(m, r, i);
    out.push_back(std::move(copy));
  }
  return out;
}

}  // namespace

std::string make_id(const std::string& prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += hex[rng() % 16];
  return id;
}

CompletionRequest parse_completion_request(const AppState& state, const std::string& body_text, bool chat) {
  json body;
  try {
    body = json::parse(body_text);
  } catch (const json::parse_error& e) {
    throw bad_request("the body is not valid JSON (error at byte " + std::to_string(e.byte) + ")");
  }
  if (!body.is_object()) throw bad_request("the body must be a JSON object");
  const auto& tok = *state.tokenizer;
  const int64_t n_vocab = state.model->config().n_vocab;

  CompletionRequest r;
  r.chat = chat;
  if (auto model = get_string(body, "model");
      model && !model->empty() && *model != state.model_name && *model != state.default_model_name) {
    throw ApiError(404, "invalid_request_error", "the model '" + *model + "' does not exist (this server serves '" +
                                                     state.model_name + "')",
                   "model", "model_not_found");
  }
  if (auto n = get_int(body, "n"); n && *n != 1) throw bad_request("only n = 1 is supported", "n");
  if (get_int(body, "best_of").value_or(1) != 1) throw bad_request("only best_of = 1 is supported", "best_of");
  get_string(body, "user");  // type-checked, otherwise unused

  // Prompt tokens.
  if (chat) {
    const json messages = normalized_messages(body);
    json extra = json::object();
    if (auto tools = body.find("tools"); tools != body.end() && !tools->is_null()) {
      if (!tools->is_array()) throw bad_request("'tools' must be an array", "tools");
      extra["tools"] = *tools;
    }
    std::string text;
    try {
      text = state.chat_template->render(messages, true, extra);
    } catch (const weights::ChatTemplateError& e) {
      throw bad_request(std::string("the chat template rejected the messages: ") + e.what(), "messages");
    }
    // Templates write the BOS token themselves where the model wants one; the
    // plain fallback does not, so the tokenizer adds it there.
    r.gen.prompt = tok.encode(text, state.chat_template->is_fallback() && tok.add_bos(), true);
  } else {
    const auto it = body.find("prompt");
    if (it == body.end() || it->is_null()) throw bad_request("'prompt' is required", "prompt");
    if (it->is_string()) {
      r.gen.prompt = tok.encode(it->get<std::string>(), tok.add_bos(), true);
    } else if (it->is_array() && !it->empty() && (*it)[0].is_string()) {
      if (it->size() != 1) throw bad_request("only one prompt per request is supported", "prompt");
      r.gen.prompt = tok.encode((*it)[0].get<std::string>(), tok.add_bos(), true);
    } else if (it->is_array() && !it->empty() && (*it)[0].is_array()) {
      if (it->size() != 1) throw bad_request("only one prompt per request is supported", "prompt");
      r.gen.prompt = token_array((*it)[0], "prompt", n_vocab);
    } else if (it->is_array()) {
      r.gen.prompt = token_array(*it, "prompt", n_vocab);
    } else {
      throw bad_request("'prompt' must be a string, an array of strings or an array of token ids", "prompt");
    }
    if (r.gen.prompt.empty()) throw bad_request("'prompt' must not be empty", "prompt");
  }

  // Length.
  std::optional<int64_t> max_tokens = get_int(body, "max_completion_tokens");
  if (!max_tokens) max_tokens = get_int(body, "max_tokens");
  if (max_tokens) {
    if (*max_tokens < 1) throw bad_request("'max_tokens' must be at least 1", "max_tokens");
    r.gen.max_tokens = static_cast<int32_t>(std::min<int64_t>(*max_tokens, INT32_MAX));
  } else if (!chat) {
    r.gen.max_tokens = 16;  // OpenAI's default for completions
  }

  // Sampling.
  engine::SamplingParams& s = r.gen.sampling;
  if (auto v = get_number(body, "temperature")) s.temperature = in_range(*v, 0.0, 2.0, "temperature");
  if (auto v = get_number(body, "top_p")) s.top_p = in_range(*v, 0.0, 1.0, "top_p");
  if (s.top_p == 0.0f) s.temperature = 0.0f;  // top_p 0 means "only the most likely token"
  if (auto v = get_int(body, "top_k")) {
    if (*v < -1) throw bad_request("'top_k' must be -1 (off) or positive", "top_k");
    s.top_k = *v <= 0 ? 0 : static_cast<int32_t>(std::min<int64_t>(*v, n_vocab));
  }
  if (auto v = get_number(body, "min_p")) s.min_p = in_range(*v, 0.0, 1.0, "min_p");
  if (auto v = get_number(body, "presence_penalty")) s.presence_penalty = in_range(*v, -2.0, 2.0, "presence_penalty");
  if (auto v = get_number(body, "frequency_penalty")) s.frequency_penalty = in_range(*v, -2.0, 2.0, "frequency_penalty");
  if (auto v = get_number(body, "repetition_penalty")) {
    s.repetition_penalty = in_range(*v, 0.01, 100.0, "repetition_penalty");
  }
  if (auto v = get_int(body, "seed")) s.seed = static_cast<uint64_t>(*v);
  if (auto it = body.find("logit_bias"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) throw bad_request("'logit_bias' must be an object of token id to bias", "logit_bias");
    for (const auto& [key, value] : it->items()) {
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != key.size() || id < 0 || id >= n_vocab) {
        throw bad_request("'logit_bias' key '" + key + "' is not a token id of this model", "logit_bias");
      }
      if (!value.is_number()) throw bad_request("'logit_bias' values must be numbers", "logit_bias");
      s.logit_bias.emplace_back(static_cast<int32_t>(id), in_range(value.get<double>(), -100.0, 100.0, "logit_bias"));
    }
  }
  if (chat) {
    r.logprobs = get_bool(body, "logprobs").value_or(false);
    if (auto v = get_int(body, "top_logprobs")) {
      if (*v < 0 || *v > 20) throw bad_request("'top_logprobs' must be between 0 and 20", "top_logprobs");
      if (!r.logprobs && *v > 0) throw bad_request("'top_logprobs' requires 'logprobs': true", "top_logprobs");
      r.top_logprobs = static_cast<int32_t>(*v);
    }
  } else if (auto v = get_int(body, "logprobs")) {
    if (*v < 0 || *v > 20) throw bad_request("'logprobs' must be between 0 and 20", "logprobs");
    r.logprobs = true;
    r.top_logprobs = static_cast<int32_t>(*v);
  }
  s.logprobs = r.logprobs;
  s.n_top_logprobs = r.top_logprobs;

  // Stopping.
  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      r.gen.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->size() > 4) throw bad_request("at most 4 stop strings are allowed", "stop");
      for (const json& v : *it) {
        if (!v.is_string()) throw bad_request("'stop' must be a string or an array of strings", "stop");
        r.gen.stop.push_back(v.get<std::string>());
      }
    } else {
      throw bad_request("'stop' must be a string or an array of strings", "stop");
    }
  }
  if (auto it = body.find("stop_token_ids"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) throw bad_request("'stop_token_ids' must be an array of token ids", "stop_token_ids");
    r.gen.stop_token_ids = token_array(*it, "stop_token_ids", n_vocab);
  }
  r.gen.ignore_eos = get_bool(body, "ignore_eos").value_or(false);

  // Streaming.
  r.stream = get_bool(body, "stream").value_or(false);
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) throw bad_request("'stream_options' must be an object", "stream_options");
    r.include_usage = get_bool(*it, "include_usage").value_or(false);
  }
  return r;
}

}  // namespace llm::server
