#pragma once
// One request's generation state, independent of where it runs: the prompt
// still to prefill, sampling, streaming detokenization, stop conditions and
// the result. The caller owns the KV cache and runs the forward passes; the
// Generator (one sequence) and the Engine (many slots) both drive Sequences.
#include <chrono>
#include <cstdint>
#include <span>

#include "engine/generation.h"
#include "engine/sampler.h"
#include "engine/stop_matcher.h"
#include "weights/detokenizer.h"
#include "weights/tokenizer.h"

namespace llm::engine {

// Checks a request against the model and a context length; throws RequestError.
void validate_request(const GenerationRequest& req, int64_t n_vocab, int64_t n_ctx);

class Sequence {
 public:
  // The request must have passed validate_request for this n_ctx.
  Sequence(GenerationRequest req, const weights::Tokenizer& tokenizer, int64_t n_vocab, int64_t n_ctx);

  const GenerationRequest& request() const { return req_; }
  bool prefilling() const { return n_prefilled_ < static_cast<int64_t>(req_.prompt.size()); }
  // The next prompt tokens to run (at most max), and how many were run.
  std::span<const int32_t> next_prefill_chunk(int64_t max) const;
  void prefilled(int64_t n);
  // The token whose forward pass comes next during decode.
  int32_t last_token() const { return result_.tokens.back(); }

  // After a forward pass that ended on the last prompt token or on
  // last_token(): samples, streams what is safe to show through on_token, and
  // returns true when the sequence has finished (result().finish is set).
  bool accept_logits(std::span<const float> logits, int64_t n_past, const TokenCallback& on_token);

  // Ends the sequence now (client gone, shutdown).
  void finish(FinishReason reason);
  bool finished() const { return finished_; }
  GenerationResult& result() { return result_; }

 private:
  void emit(TokenEvent& ev, std::string text, const TokenCallback& on_token);
  void mark_time_done();

  GenerationRequest req_;
  const weights::Tokenizer* tokenizer_;
  int64_t n_ctx_;
  int64_t max_new_;
  int64_t n_prefilled_ = 0;
  Sampler sampler_;
  weights::IncrementalDetokenizer detok_;
  StopMatcher stops_;
  std::vector<float> logits_;
  GenerationResult result_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point t_start_, t_first_;
};

}  // namespace llm::engine
