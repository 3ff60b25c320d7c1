#include "server/metrics.h"

#include <spdlog/fmt/fmt.h>

namespace llm::server {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  std::lock_guard lock(mutex_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name) const {
  std::lock_guard lock(mutex_);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, count_);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, sum_, name, count_);
}

Metrics::Metrics()
    : ttft_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      tpot_({0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5}) {}

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard lock(mutex_);
  ++requests_[{endpoint, status}];
}

void Metrics::add_tokens(int64_t prompt, int64_t generated) {
  prompt_tokens_ += static_cast<uint64_t>(prompt);
  generated_tokens_ += static_cast<uint64_t>(generated);
}

std::string Metrics::render(const engine::Engine* engine) const {
  std::string out;
  out += "# HELP llm_requests_total HTTP requests by endpoint and status.\n# TYPE llm_requests_total counter\n";
  {
    std::lock_guard lock(mutex_);
    for (const auto& [key, n] : requests_) {
      out += fmt::format("llm_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, n);
    }
  }
  out += "# HELP llm_prompt_tokens_total Prompt tokens processed.\n# TYPE llm_prompt_tokens_total counter\n";
  out += fmt::format("llm_prompt_tokens_total {}\n", prompt_tokens_.load());
  out += "# HELP llm_generation_tokens_total Tokens generated.\n# TYPE llm_generation_tokens_total counter\n";
  out += fmt::format("llm_generation_tokens_total {}\n", generated_tokens_.load());
  const engine::EngineStats s = engine != nullptr ? engine->stats() : engine::EngineStats{};
  out += "# HELP llm_requests_running Sequences being generated.\n# TYPE llm_requests_running gauge\n";
  out += fmt::format("llm_requests_running {}\n", s.n_running);
  out += "# HELP llm_requests_queued Requests waiting for a slot.\n# TYPE llm_requests_queued gauge\n";
  out += fmt::format("llm_requests_queued {}\n", s.n_queued);
  out += "# HELP llm_kv_cache_usage_ratio Share of KV cache positions in use.\n# TYPE llm_kv_cache_usage_ratio gauge\n";
  out += fmt::format("llm_kv_cache_usage_ratio {}\n",
                     s.kv_tokens_total > 0 ? static_cast<double>(s.kv_tokens_used) / s.kv_tokens_total : 0.0);
  out += "# HELP llm_time_to_first_token_seconds Time from request to first token.\n"
         "# TYPE llm_time_to_first_token_seconds histogram\n";
  ttft_.render(out, "llm_time_to_first_token_seconds");
  out += "# HELP llm_time_per_output_token_seconds Time between generated tokens.\n"
         "# TYPE llm_time_per_output_token_seconds histogram\n";
  tpot_.render(out, "llm_time_per_output_token_seconds");
  return out;
}

}  // namespace llm::server
