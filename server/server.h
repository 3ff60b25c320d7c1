#pragma once
// The server's lifecycle: listen at once (health says "loading"), load the
// model in the background, serve, and on SIGINT/SIGTERM stop accepting, let
// running requests finish within the shutdown timeout, then exit.
#include "server/config.h"

namespace llm::server {

void setup_logging(const std::string& format);  // "text" or "json"

// Runs until shutdown; returns the process exit code.
int run_server(const ServerConfig& config);

}  // namespace llm::server
