#pragma once
// Command-line configuration of llm-server.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace llm::server {

struct ServerConfig {
  std::string model_path;
  std::string host = "127.0.0.1";
  uint16_t port = 8080;
  int64_t ctx = 0;                  // 0: min(model's trained context, 4096)
  int parallel = 4;
  int threads = 0;                  // 0: all cores
  std::string api_key;              // empty: no authentication
  std::string model_alias;          // empty: the checkpoint's directory or file name
  int64_t max_queue = 64;
  std::string cors_origin;          // empty: no CORS headers
  std::string log_format = "text";  // text | json
  size_t max_body_bytes = 4u << 20;
  int timeout_seconds = 60;         // reading a request, and idle keep-alive
  int shutdown_timeout_seconds = 10;
  int64_t prefill_chunk = 256;
};

// Parses argv (and LLM_API_KEY from the environment). On --help prints usage
// and returns nullopt with exit_code 0; on bad arguments prints the problem
// and returns nullopt with exit_code 2.
std::optional<ServerConfig> parse_args(int argc, char** argv, int& exit_code);

}  // namespace llm::server
