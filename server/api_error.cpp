#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace llm::server {

std::string ApiError::to_json() const {
  nlohmann::ordered_json e = {{"message", what()}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (param) e["param"] = *param;
  if (code) e["code"] = *code;
  return nlohmann::ordered_json{{"error", e}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ApiError bad_request(const std::string& message, std::optional<std::string> param) {
  return ApiError(400, "invalid_request_error", message, std::move(param));
}

}  // namespace llm::server
