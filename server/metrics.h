#pragma once
// Prometheus metrics of the server: counters and histograms updated by the
// handlers, gauges read from the engine when /metrics is scraped.
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace llm::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // Appends the _bucket/_sum/_count lines of metric `name`.
  void render(std::string& out, const std::string& name) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void count_request(const std::string& endpoint, int status);
  void add_tokens(int64_t prompt, int64_t generated);
  void observe_ttft(double seconds) { ttft_.observe(seconds); }
  void observe_tpot(double seconds) { tpot_.observe(seconds); }
  // Prometheus text exposition; engine may be null while the model loads.
  std::string render(const engine::Engine* engine) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::atomic<uint64_t> prompt_tokens_{0};
  std::atomic<uint64_t> generated_tokens_{0};
  Histogram ttft_;
  Histogram tpot_;
};

}  // namespace llm::server
