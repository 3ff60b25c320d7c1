#include "engine/kv_cache.h"

#include <stdexcept>
#include <string>

namespace llm::engine {

KvCache::KvCache(const weights::ModelConfig& c, int64_t n_ctx)
    : n_layers_(c.n_layers), n_ctx_(n_ctx), kv_dim_(c.n_kv_heads * c.head_dim) {
  if (n_ctx <= 0) throw std::invalid_argument("KV cache context must be positive, got " + std::to_string(n_ctx));
  const auto n = static_cast<size_t>(n_layers_ * n_ctx_ * kv_dim_);
  k_.reset(new float[n]);  // uninitialised on purpose: rows are written before they are read
  v_.reset(new float[n]);
}

}  // namespace llm::engine
