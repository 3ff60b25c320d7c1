#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

namespace llm::engine {

std::string validate(const SamplingParams& p, int32_t n_vocab) {
  if (!(p.temperature >= 0.0f) || p.temperature > 100.0f) return "temperature must be between 0 and 100";
  if (p.top_k < 0) return "top_k must be >= 0";
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return "top_p must be in (0, 1]";
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return "min_p must be in [0, 1]";
  if (!(p.repetition_penalty > 0.0f) || p.repetition_penalty > 100.0f) return "repetition_penalty must be in (0, 100]";
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) return "presence_penalty must be in [-2, 2]";
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) return "frequency_penalty must be in [-2, 2]";
  if (p.n_top_logprobs < 0 || p.n_top_logprobs > 20) return "top_logprobs must be between 0 and 20";
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= n_vocab) return "logit_bias token " + std::to_string(id) + " is outside the vocabulary";
    if (!(bias >= -100.0f && bias <= 100.0f)) return "logit_bias values must be in [-100, 100]";
  }
  return {};
}

Sampler::Sampler(SamplingParams params, int32_t n_vocab)
    : params_(std::move(params)), n_vocab_(n_vocab), seen_(static_cast<size_t>(n_vocab), 0) {
  rng_.seed(params_.seed ? *params_.seed : std::random_device{}());
}

void Sampler::add_prompt(std::span<const int32_t> ids) {
  for (int32_t id : ids) {
    if (id >= 0 && id < n_vocab_) seen_[static_cast<size_t>(id)] = 1;
  }
}

void Sampler::add_generated(int32_t id) {
  if (id < 0 || id >= n_vocab_) return;
  seen_[static_cast<size_t>(id)] = 1;
  ++generated_counts_[id];
}

void Sampler::apply_bias_and_penalties(std::span<float> logits) const {
  for (const auto& [id, bias] : params_.logit_bias) logits[static_cast<size_t>(id)] += bias;
  if (params_.repetition_penalty != 1.0f) {
    const float r = params_.repetition_penalty;
    for (size_t id = 0; id < seen_.size(); ++id) {
      if (!seen_[id]) continue;
      float& l = logits[id];
      l = l > 0.0f ? l / r : l * r;
    }
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    for (const auto& [id, count] : generated_counts_) {
      logits[static_cast<size_t>(id)] -= params_.presence_penalty + params_.frequency_penalty * static_cast<float>(count);
    }
  }
}

Sampled Sampler::sample(std::span<float> logits) {
  const bool want_logprobs = params_.logprobs || params_.n_top_logprobs > 0;
  if (want_logprobs) raw_.assign(logits.begin(), logits.end());
  apply_bias_and_penalties(logits);
  Sampled out;
  out.id = pick(logits);
  if (want_logprobs) fill_logprobs(raw_, out);
  return out;
}

void Sampler::fill_logprobs(std::span<const float> raw, Sampled& out) {
  const float max = *std::max_element(raw.begin(), raw.end());
  double sum = 0.0;
  for (float l : raw) sum += std::exp(static_cast<double>(l) - max);
  const double log_z = max + std::log(sum);
  out.logprob = static_cast<float>(raw[static_cast<size_t>(out.id)] - log_z);
  if (params_.n_top_logprobs > 0) {
    sorted_candidates(raw, static_cast<size_t>(params_.n_top_logprobs));
    for (int32_t i = 0; i < params_.n_top_logprobs && i < n_vocab_; ++i) {
      const int32_t id = candidates_[static_cast<size_t>(i)];
      out.top.push_back({id, static_cast<float>(raw[static_cast<size_t>(id)] - log_z)});
    }
  }
}

void Sampler::sorted_candidates(std::span<const float> logits, size_t n_needed) {
  candidates_.resize(logits.size());
  std::iota(candidates_.begin(), candidates_.end(), 0);
  // Higher logit first; ties by lower id so results do not depend on the sort.
  auto better = [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
           (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
  };
  if (n_needed < candidates_.size()) {
    std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(n_needed),
                      candidates_.end(), better);
    candidates_.resize(n_needed);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), better);
  }
}

int32_t Sampler::pick(std::span<const float> logits) {
  if (params_.temperature == 0.0f) {
    // Greedy; the lowest id wins a tie.
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  const double inv_t = 1.0 / params_.temperature;
  const float max = *std::max_element(logits.begin(), logits.end());
  double z = 0.0;
  for (float l : logits) z += std::exp((static_cast<double>(l) - max) * inv_t);
  auto prob = [&](int32_t id) { return std::exp((static_cast<double>(logits[static_cast<size_t>(id)]) - max) * inv_t) / z; };

  const bool truncate = params_.top_k > 0 || params_.top_p < 1.0f || params_.min_p > 0.0f;
  if (!truncate) {
    // Plain temperature sampling: one pass, no sort.
    double r = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    for (int32_t id = 0; id < n_vocab_; ++id) {
      r -= prob(id);
      if (r <= 0.0) return id;
    }
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }

  // The head of the distribution is usually enough: sort 1024 first and fall
  // back to the whole vocabulary only if the top-p mass or min-p cut reaches past it.
  size_t n_head = params_.top_k > 0 ? static_cast<size_t>(params_.top_k) : 1024;
  for (;;) {
    n_head = std::min(n_head, logits.size());
    sorted_candidates(logits, n_head);
    probs_.resize(candidates_.size());
    double mass = 0.0;
    for (size_t i = 0; i < candidates_.size(); ++i) mass += probs_[i] = prob(candidates_[i]);
    const bool complete = n_head == logits.size() || params_.top_k > 0 ||
                          ((params_.top_p >= 1.0f || mass >= params_.top_p) &&
                           (params_.min_p == 0.0f || probs_.back() < params_.min_p * probs_.front()));
    if (complete) break;
    n_head = logits.size();
  }
  // top-k is already applied by the candidate count. top-p: the smallest prefix
  // whose mass reaches top_p. min-p: drop tokens below min_p * p_max.
  size_t n_keep = candidates_.size();
  if (params_.top_p < 1.0f) {
    double cum = 0.0;
    for (size_t i = 0; i < n_keep; ++i) {
      cum += probs_[i];
      if (cum >= params_.top_p) {
        n_keep = i + 1;
        break;
      }
    }
  }
  if (params_.min_p > 0.0f) {
    const double floor = params_.min_p * probs_.front();
    size_t i = 1;
    while (i < n_keep && probs_[i] >= floor) ++i;
    n_keep = i;
  }
  double total = 0.0;
  for (size_t i = 0; i < n_keep; ++i) total += probs_[i];
  double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
  for (size_t i = 0; i < n_keep; ++i) {
    r -= probs_[i];
    if (r <= 0.0) return candidates_[i];
  }
  return candidates_[n_keep - 1];
}

}  // namespace llm::engine
