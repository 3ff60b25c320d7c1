#pragma once
// Keys and values of one sequence, owned by the caller (the model is shared
// and immutable). Layout per layer: [n_ctx, n_kv_heads * head_dim].
#include <cstdint>
#include <memory>

#include "weights/model_config.h"

namespace llm::engine {

class KvCache {
 public:
  // Memory is reserved, not touched: pages are committed as positions fill.
  KvCache(const weights::ModelConfig& config, int64_t n_ctx);

  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_past() const { return n_past_; }  // positions already filled
  int64_t kv_dim() const { return kv_dim_; }
  size_t bytes() const { return 2 * static_cast<size_t>(n_layers_ * n_ctx_ * kv_dim_) * sizeof(float); }

  float* k(int64_t layer) { return k_.get() + layer * n_ctx_ * kv_dim_; }
  float* v(int64_t layer) { return v_.get() + layer * n_ctx_ * kv_dim_; }

  void advance(int64_t n) { n_past_ += n; }
  // Forget everything after position n (e.g. to reuse a shared prompt prefix).
  void truncate(int64_t n) { n_past_ = n < n_past_ ? n : n_past_; }
  void clear() { n_past_ = 0; }

 private:
  int64_t n_layers_, n_ctx_, kv_dim_;
  int64_t n_past_ = 0;
  std::unique_ptr<float[]> k_, v_;
};

}  // namespace llm::engine
