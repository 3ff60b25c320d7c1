#pragma once
// Maps method and path to a handler (free functions in handlers.cpp and
// completions.cpp), and applies what all routes share: CORS preflight,
// authentication, 404/405, and 503 while the model loads or the server stops.
#include <memory>
#include <string>
#include <vector>

#include "server/app_state.h"
#include "server/exchange.h"

namespace llm::server {

using Handler = void (*)(AppState& state, const Request& req, std::shared_ptr<Exchange> ex);

struct Route {
  http::verb method;
  std::string path;
  Handler handler;
  bool needs_model;  // 503 until the model is loaded
  bool public_route; // reachable without the API key
};

class Router {
 public:
  Router();  // registers the API's routes
  void dispatch(AppState& state, const Request& req, std::shared_ptr<Exchange> ex) const;

 private:
  std::vector<Route> routes_;
};

// Helpers shared by the handlers.
Response json_response(int status, const std::string& body);
void respond_error(Exchange& ex, int status, const std::string& type, const std::string& message,
                   std::optional<std::string> param = {}, std::optional<std::string> code = {});

}  // namespace llm::server
