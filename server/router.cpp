#include "server/router.h"

#include "server/api_error.h"
#include "server/handlers.h"

namespace llm::server {

Response json_response(int status, const std::string& body) {
  Response res{static_cast<http::status>(status), 11};
  res.set(http::field::content_type, "application/json");
  res.body() = body;
  return res;
}

void respond_error(Exchange& ex, int status, const std::string& type, const std::string& message,
                   std::optional<std::string> param, std::optional<std::string> code) {
  ex.respond(json_response(status, ApiError(status, type, message, std::move(param), std::move(code)).to_json()));
}

Router::Router() {
  using http::verb;
  routes_ = {
      {verb::post, "/v1/chat/completions", handle_chat_completions, true, false},
      {verb::post, "/v1/completions", handle_completions, true, false},
      {verb::get, "/v1/models", handle_models, true, false},
      {verb::get, "/health", handle_health, false, true},
      {verb::get, "/metrics", handle_metrics, false, true},  // scrapers carry no key, as with vLLM
      {verb::post, "/tokenize", handle_tokenize, true, false},
      {verb::post, "/detokenize", handle_detokenize, true, false},
  };
}

namespace {

std::string path_of(const Request& req) {
  std::string target(req.target());
  const size_t q = target.find('?');
  return q == std::string::npos ? target : target.substr(0, q);
}

bool authorized(const AppState& state, const Request& req) {
  if (state.config.api_key.empty()) return true;
  const auto it = req.find(http::field::authorization);
  if (it == req.end()) return false;
  const std::string_view value(it->value().data(), it->value().size());
  constexpr std::string_view prefix = "Bearer ";
  if (value.size() <= prefix.size() || value.substr(0, prefix.size()) != prefix) return false;
  const std::string_view key = value.substr(prefix.size());
  // Constant-time comparison: the key is a secret.
  const std::string& want = state.config.api_key;
  unsigned diff = key.size() == want.size() ? 0u : 1u;
  for (size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned>(key[i] ^ want[i % want.size()]);
  return diff == 0;
}

}  // namespace

void Router::dispatch(AppState& state, const Request& req, std::shared_ptr<Exchange> ex) const {
  const std::string path = path_of(req);
  if (req.method() == http::verb::options && !state.config.cors_origin.empty()) {
    // CORS preflight: browsers send it without credentials.
    Response res{http::status::no_content, 11};
    res.set(http::field::access_control_allow_methods, "GET, POST, OPTIONS");
    res.set(http::field::access_control_allow_headers, "Authorization, Content-Type");
    res.set(http::field::access_control_max_age, "86400");
    state.metrics.count_request(path, 204);
    return ex->respond(std::move(res));
  }
  const Route* match = nullptr;
  std::string allowed;
  for (const Route& r : routes_) {
    if (r.path != path) continue;
    if (r.method == req.method()) match = &r;
    allowed += (allowed.empty() ? "" : ", ") + std::string(http::to_string(r.method));
  }
  auto fail = [&](int status, const std::string& type, const std::string& message, std::optional<std::string> code) {
    state.metrics.count_request(match != nullptr ? path : "other", status);
    respond_error(*ex, status, type, message, std::nullopt, std::move(code));
  };
  if (match == nullptr && allowed.empty()) {
    return fail(404, "invalid_request_error", "no route for " + std::string(req.method_string()) + " " + path,
                "not_found");
  }
  if (match == nullptr) {
    Response res = json_response(405, ApiError(405, "invalid_request_error",
                                               std::string(req.method_string()) + " is not allowed on " + path +
                                                   " (allowed: " + allowed + ")",
                                               std::nullopt, "method_not_allowed")
                                          .to_json());
    res.set(http::field::allow, allowed);
    state.metrics.count_request(path, 405);
    return ex->respond(std::move(res));
  }
  if (!match->public_route && !authorized(state, req)) {
    return fail(401, "authentication_error", "missing or invalid API key (send 'Authorization: Bearer <key>')",
                "invalid_api_key");
  }
  if (state.shutting_down) return fail(503, "server_error", "the server is shutting down", "shutting_down");
  if (match->needs_model && !state.ready.load(std::memory_order_acquire)) {
    return fail(503, "server_error", "the model is still loading", "model_loading");
  }
  match->handler(state, req, std::move(ex));
}

}  // namespace llm::server
