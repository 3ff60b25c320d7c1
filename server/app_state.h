#pragma once
// What every handler can reach: configuration, the loaded model (once
// ready), the engine and the metrics.
#include <atomic>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "server/config.h"
#include "server/metrics.h"
#include "weights/chat_template.h"
#include "weights/tokenizer.h"

namespace llm::server {

struct AppState {
  explicit AppState(ServerConfig c) : config(std::move(c)) {}

  ServerConfig config;
  Metrics metrics;
  std::atomic<bool> shutting_down{false};

  // Set by the loader before `ready` turns true (release); read only after
  // seeing `ready` (acquire).
  std::atomic<bool> ready{false};
  std::string model_name;          // --model-alias, else default_model_name
  std::string default_model_name;  // the checkpoint's directory or file name
  int64_t created = 0;  // unix time the model was loaded
  std::shared_ptr<const engine::Model> model;
  std::unique_ptr<weights::Tokenizer> tokenizer;
  std::unique_ptr<weights::ChatTemplate> chat_template;
  std::unique_ptr<engine::Engine> engine;

  // Requests between arrival and the end of their response, for shutdown.
  std::atomic<int64_t> n_open_exchanges{0};
};

}  // namespace llm::server
