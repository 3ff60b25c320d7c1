// llm-server: an OpenAI-compatible HTTP server for Qwen2/Llama models.
#include "server/config.h"
#include "server/server.h"

int main(int argc, char** argv) {
  int exit_code = 0;
  const auto config = llm::server::parse_args(argc, argv, exit_code);
  if (!config) return exit_code;
  llm::server::setup_logging(config->log_format);
  return llm::server::run_server(*config);
}
