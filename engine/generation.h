#pragma once
// The vocabulary of generation shared by the Generator and the Engine:
// requests, streamed token events, results.
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/sampler.h"

namespace llm::engine {

// A request the engine cannot serve as asked (prompt too long, bad parameters).
// The server maps it to HTTP 400.
class RequestError : public std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int32_t max_tokens = 0;  // 0: until the context is full
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
};

enum class FinishReason { stop, length, cancelled };
const char* finish_reason_name(FinishReason r);

struct TokenEvent {
  int32_t id = -1;   // -1: a final piece of held-back text released at the end
  std::string text;  // safe to show now (whole UTF-8 characters, no stop-string prefix); may be empty
  std::optional<float> logprob;
  std::vector<TokenLogprob> top_logprobs;
};

struct GenerationResult {
  FinishReason finish = FinishReason::stop;
  std::string text;               // everything streamed, concatenated
  std::vector<int32_t> tokens;    // every sampled token (including a final EOS)
  int32_t n_prompt_tokens = 0;
  int32_t n_generated_tokens = 0;
  double prefill_seconds = 0.0;   // until the first token was sampled
  double decode_seconds = 0.0;
};

using TokenCallback = std::function<void(const TokenEvent&)>;

}  // namespace llm::engine
