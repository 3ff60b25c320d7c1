#pragma once
// Route handlers: free functions, one per endpoint.
#include <memory>

#include "server/app_state.h"
#include "server/exchange.h"

namespace llm::server {

void handle_chat_completions(AppState& state, const Request& req, std::shared_ptr<Exchange> ex);
void handle_completions(AppState& state, const Request& req, std::shared_ptr<Exchange> ex);
void handle_models(AppState& state, const Request& req, std::shared_ptr<Exchange> ex);
void handle_health(AppState& state, const Request& req, std::shared_ptr<Exchange> ex);
void handle_metrics(AppState& state, const Request& req, std::shared_ptr<Exchange> ex);
void handle_tokenize(AppState& state, const Request& req, std::shared_ptr<Exchange> ex);
void handle_detokenize(AppState& state, const Request& req, std::shared_ptr<Exchange> ex);

}  // namespace llm::server
