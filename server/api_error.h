#pragma once
// Errors in the OpenAI shape: {"error": {"message", "type", "param", "code"}}.
#include <optional>
#include <stdexcept>
#include <string>

namespace llm::server {

struct ApiError : std::runtime_error {
  ApiError(int status, std::string type, const std::string& message, std::optional<std::string> param = {},
           std::optional<std::string> code = {})
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}

  int status;
  std::string type;
  std::optional<std::string> param;
  std::optional<std::string> code;

  std::string to_json() const;  // the response body
};

ApiError bad_request(const std::string& message, std::optional<std::string> param = {});

}  // namespace llm::server
