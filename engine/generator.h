#pragma once
// Generation for one sequence at a time: prefill, decode, sampling, stop
// conditions, and streaming of text that is safe to show.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "weights/tokenizer.h"

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

class Generator {
 public:
  // n_ctx: context length of this generator's KV cache (0: the model's trained length).
  Generator(std::shared_ptr<const Model> model, const weights::Tokenizer& tokenizer, int n_threads = 0,
            int64_t n_ctx = 0, int64_t max_batch = 512);

  int64_t n_ctx() const { return cache_.n_ctx(); }

  // Throws RequestError before any work if the request cannot be served.
  // on_token is called for every sampled token that is not an end token, as
  // soon as its text is safe to show. A stop request ends generation at the
  // next token (or prefill chunk) with FinishReason::cancelled.
  GenerationResult generate(const GenerationRequest& request, const TokenCallback& on_token,
                            std::stop_token cancel = {});

 private:
  std::shared_ptr<const Model> model_;
  const weights::Tokenizer* tokenizer_;
  KvCache cache_;
  ForwardContext ctx_;
  std::vector<float> logits_;
};

}  // namespace llm::engine
