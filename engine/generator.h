#pragma once
// Generation of one sequence at a time, synchronously on the caller's thread
// (llm-generate, tests). The server uses the Engine, which runs many.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <vector>

#include "engine/generation.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "weights/tokenizer.h"

namespace llm::engine {

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
};

}  // namespace llm::engine
