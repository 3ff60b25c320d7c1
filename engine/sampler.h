#pragma once
// Turns logits into the next token: logit bias, repetition/presence/frequency
// penalties, then greedy or temperature + top-k + top-p + min-p sampling.
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace llm::engine {

struct SamplingParams {
  float temperature = 1.0f;         // 0: greedy
  int32_t top_k = 0;                // 0: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off; keeps tokens with p >= min_p * p_max
  float repetition_penalty = 1.0f;  // 1: off; over prompt and generated tokens (HF/CTRL style)
  float presence_penalty = 0.0f;    // OpenAI: over generated tokens
  float frequency_penalty = 0.0f;   // OpenAI: over generated tokens, times their count
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::optional<uint64_t> seed;     // none: a random seed
  int32_t n_top_logprobs = 0;       // alternatives reported with each token
  bool logprobs = false;            // report the chosen token's log-probability
};

// Returns an empty string when valid, else a message naming the bad field.
std::string validate(const SamplingParams& p, int32_t n_vocab);

struct TokenLogprob {
  int32_t id;
  float logprob;
};

struct Sampled {
  int32_t id = -1;
  // Filled when SamplingParams::logprobs or n_top_logprobs ask for it; from the
  // model's distribution before temperature and truncation, as vLLM reports.
  std::optional<float> logprob;
  std::vector<TokenLogprob> top;  // most likely first
};

class Sampler {
 public:
  Sampler(SamplingParams params, int32_t n_vocab);

  // Registers tokens seen so far: prompt tokens count only for the
  // repetition penalty; generated ones for all penalties.
  void add_prompt(std::span<const int32_t> ids);
  void add_generated(int32_t id);

  // logits: [n_vocab], modified in place.
  Sampled sample(std::span<float> logits);

  const SamplingParams& params() const { return params_; }

 private:
  void apply_bias_and_penalties(std::span<float> logits) const;
  void fill_logprobs(std::span<const float> raw, Sampled& out);
  int32_t pick(std::span<const float> logits);
  // Candidates sorted by logit, most likely first: all of them, or (when the
  // truncation rules allow) just enough of the head of the distribution.
  void sorted_candidates(std::span<const float> logits, size_t n_needed);

  SamplingParams params_;
  int32_t n_vocab_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int32_t> generated_counts_;
  std::vector<uint8_t> seen_;  // prompt or generated, for the repetition penalty
  std::vector<int32_t> candidates_;
  std::vector<double> probs_;
  std::vector<float> raw_;  // logits before bias and penalties, for logprobs
};

}  // namespace llm::engine
