#include "server/handlers.h"

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/router.h"

namespace llm::server {

using json = nlohmann::ordered_json;  // responses keep OpenAI's field order

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void reply(AppState& state, Exchange& ex, const char* endpoint, int status, const json& body) {
  state.metrics.count_request(endpoint, status);
  ex.respond(json_response(status, dump(body)));
}

// Parses a JSON object body or answers 400 and returns nullopt.
std::optional<json> parse_object(AppState& state, const Request& req, Exchange& ex, const char* endpoint) {
  try {
    json j = json::parse(req.body());
    if (j.is_object()) return j;
  } catch (const nlohmann::json::parse_error&) {
  }
  state.metrics.count_request(endpoint, 400);
  respond_error(ex, 400, "invalid_request_error", "the body must be a JSON object");
  return std::nullopt;
}

}  // namespace

void handle_health(AppState& state, const Request&, std::shared_ptr<Exchange> ex) {
  if (state.shutting_down) return reply(state, *ex, "/health", 503, {{"status", "shutting_down"}});
  if (!state.ready.load(std::memory_order_acquire)) return reply(state, *ex, "/health", 503, {{"status", "loading"}});
  reply(state, *ex, "/health", 200, {{"status", "ok"}});
}

void handle_models(AppState& state, const Request&, std::shared_ptr<Exchange> ex) {
  const auto& c = state.model->config();
  json model = {{"id", state.model_name},
                {"object", "model"},
                {"created", state.created},
                {"owned_by", "llm-server"},
                {"max_model_len", state.engine->options().n_ctx},
                {"meta",
                 {{"architecture", c.arch_name()},
                  {"n_layers", c.n_layers},
                  {"n_embd", c.n_embd},
                  {"n_vocab", c.n_vocab},
                  {"n_ctx_train", c.n_ctx_train},
                  {"weight_type", state.model->stored_weight_type()}}}};
  reply(state, *ex, "/v1/models", 200, {{"object", "list"}, {"data", json::array({model})}});
}

void handle_metrics(AppState& state, const Request&, std::shared_ptr<Exchange> ex) {
  state.metrics.count_request("/metrics", 200);
  Response res{http::status::ok, 11};
  res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
  res.body() = state.metrics.render(state.ready.load(std::memory_order_acquire) ? state.engine.get() : nullptr);
  ex->respond(std::move(res));
}

void handle_tokenize(AppState& state, const Request& req, std::shared_ptr<Exchange> ex) {
  const auto body = parse_object(state, req, *ex, "/tokenize");
  if (!body) return;
  const auto content = body->find("content");
  if (content == body->end() || !content->is_string()) {
    state.metrics.count_request("/tokenize", 400);
    return respond_error(*ex, 400, "invalid_request_error", "'content' must be a string", "content");
  }
  bool add_special = false;
  if (const auto it = body->find("add_special"); it != body->end() && !it->is_null()) {
    if (!it->is_boolean()) {
      state.metrics.count_request("/tokenize", 400);
      return respond_error(*ex, 400, "invalid_request_error", "'add_special' must be true or false", "add_special");
    }
    add_special = it->get<bool>();
  }
  const auto ids = state.tokenizer->encode(content->get<std::string>(), add_special && state.tokenizer->add_bos(), true);
  reply(state, *ex, "/tokenize", 200, {{"tokens", ids}});
}

void handle_detokenize(AppState& state, const Request& req, std::shared_ptr<Exchange> ex) {
  const auto body = parse_object(state, req, *ex, "/detokenize");
  if (!body) return;
  const auto tokens = body->find("tokens");
  std::vector<int32_t> ids;
  bool ok = tokens != body->end() && tokens->is_array();
  if (ok) {
    for (const json& t : *tokens) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= state.model->config().n_vocab) {
        ok = false;
        break;
      }
      ids.push_back(t.get<int32_t>());
    }
  }
  if (!ok) {
    state.metrics.count_request("/detokenize", 400);
    return respond_error(*ex, 400, "invalid_request_error", "'tokens' must be an array of token ids of this model",
                         "tokens");
  }
  reply(state, *ex, "/detokenize", 200, {{"content", state.tokenizer->decode(ids)}});
}

}  // namespace llm::server
