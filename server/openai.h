#pragma once
// The OpenAI request mapping: JSON bodies of /v1/chat/completions and
// /v1/completions into engine requests, validated field by field.
#include <string>

#include "engine/generation.h"
#include "server/app_state.h"

namespace llm::server {

struct CompletionRequest {
  bool chat = false;
  engine::GenerationRequest gen;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;       // report logprobs of chosen tokens
  int32_t top_logprobs = 0;    // and this many alternatives
};

// Throws ApiError (400 for bad JSON, types or values; 404 for an unknown model).
CompletionRequest parse_completion_request(const AppState& state, const std::string& body, bool chat);

// Random id with the given prefix ("chatcmpl-", "cmpl-").
std::string make_id(const std::string& prefix);

}  // namespace llm::server
