#pragma once
// The decoder: immutable after load, shared by every sequence. Per-sequence
// state (KvCache) and per-caller scratch (ForwardContext) live outside it.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/ops.h"
#include "engine/thread_pool.h"
#include "weights/checkpoint.h"
#include "weights/huge_buffer.h"

namespace llm::engine {

class KvCache;
class ForwardContext;

enum class Status {
  ok,
  context_full,     // the tokens do not fit in the KV cache
  invalid_token,    // an id outside the vocabulary
  empty_input,
};
const char* status_message(Status s);

struct LayerWeights {
  const float* attn_norm;                     // [n_embd]
  ops::Matrix wq, wk, wv, wo;                 // [q_dim, n_embd], [kv_dim, n_embd] x2, [n_embd, q_dim]
  const float* bq = nullptr;                  // [q_dim]  (Qwen2 only)
  const float* bk = nullptr;                  // [kv_dim]
  const float* bv = nullptr;                  // [kv_dim]
  const float* ffn_norm;                      // [n_embd]
  ops::Matrix w_gate, w_up, w_down;           // [n_ff, n_embd] x2, [n_embd, n_ff]
};

class Model {
 public:
  // Opens the checkpoint (HF directory or .gguf) and prepares f32 weights:
  // f32 tensors are used in place from the mapping, others converted once.
  static std::shared_ptr<const Model> load(const std::filesystem::path& path);
  explicit Model(std::unique_ptr<weights::Checkpoint> checkpoint);

  const weights::ModelConfig& config() const { return config_; }
  const weights::Checkpoint& checkpoint() const { return *checkpoint_; }
  std::string stored_weight_type() const { return stored_type_; }  // e.g. "bf16" (before conversion)
  size_t weight_bytes() const { return weight_bytes_; }            // f32 bytes read per token

  // Runs tokens of one sequence at positions cache.n_past().. and appends
  // their keys and values to the cache. Afterwards ctx.logits() holds the
  // logits of the last token, or of every token when all_logits is set.
  Status forward(std::span<const int32_t> tokens, KvCache& cache, ForwardContext& ctx, bool all_logits = false) const;

 private:
  Status forward_chunk(std::span<const int32_t> tokens, KvCache& cache, ForwardContext& ctx, bool all_logits,
                       float* logits_out) const;
  const float* load_vector(const std::string& name, int64_t expected);
  ops::Matrix load_matrix(const std::string& name);
  const float* to_f32(const weights::TensorView& t);

  std::unique_ptr<weights::Checkpoint> checkpoint_;
  weights::ModelConfig config_;
  std::vector<weights::HugeBuffer> owned_;  // converted tensors
  std::string stored_type_;
  size_t weight_bytes_ = 0;

  ops::Matrix embed_;     // [n_vocab, n_embd]
  std::vector<LayerWeights> layers_;
  const float* norm_;     // [n_embd]
  ops::Matrix lm_head_;   // [n_vocab, n_embd] (the embedding when tied)
};

// Scratch buffers and threads of one caller of Model::forward.
class ForwardContext {
 public:
  // n_threads: threads for BLAS and for the pool (0: all cores).
  // max_batch: tokens per forward chunk; longer inputs are processed in chunks.
  ForwardContext(const Model& model, int n_threads = 0, int64_t max_batch = 512);

  std::span<const float> logits() const { return {logits_.data(), static_cast<size_t>(n_logits_ * n_vocab_)}; }
  std::span<const float> logits_row(int64_t i) const { return {logits_.data() + i * n_vocab_, static_cast<size_t>(n_vocab_)}; }
  int64_t n_logits() const { return n_logits_; }
  int64_t max_batch() const { return max_batch_; }
  ThreadPool& pool() { return pool_; }
  int n_threads() const { return pool_.n_threads(); }

 private:
  friend class Model;
  void reserve_logits(int64_t n_rows);

  ThreadPool pool_;
  int64_t max_batch_;
  int64_t n_vocab_;
  std::vector<float> x_, xb_, xb2_, q_, att_, hb_, hb2_;  // see Model::forward_chunk for shapes
  std::vector<float> logits_;
  int64_t n_logits_ = 0;
  ops::RopeTable rope_;
  std::vector<int32_t> positions_;
};

}  // namespace llm::engine
