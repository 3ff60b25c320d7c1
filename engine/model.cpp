#include "engine/model.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "engine/kv_cache.h"

namespace llm::engine {

const char* status_message(Status s) {
  switch (s) {
    case Status::ok: return "ok";
    case Status::context_full: return "the tokens do not fit in the context";
    case Status::invalid_token: return "token id outside the vocabulary";
    case Status::empty_input: return "no tokens to process";
  }
  return "unknown status";
}

std::shared_ptr<const Model> Model::load(const std::filesystem::path& path) {
  return std::make_shared<const Model>(std::make_unique<weights::Checkpoint>(path));
}

const float* Model::to_f32(const weights::TensorView& t) {
  weight_bytes_ += static_cast<size_t>(t.n_elements()) * sizeof(float);
  if (t.dtype == weights::DType::f32 && reinterpret_cast<uintptr_t>(t.data) % alignof(float) == 0) {
    return reinterpret_cast<const float*>(t.data);  // used in place from the mapping
  }
  weights::HugeBuffer buf(static_cast<size_t>(t.n_elements()) * sizeof(float));
  weights::to_f32(t.dtype, t.data, buf.as<float>(), t.n_elements());
  owned_.push_back(std::move(buf));
  return owned_.back().as<float>();
}

const float* Model::load_vector(const std::string& name, int64_t expected) {
  const weights::TensorView& t = checkpoint_->tensor(name);
  if (t.n_elements() != expected) throw std::runtime_error(checkpoint_->path().string() + ": bad size of " + name);
  return to_f32(t);
}

ops::Matrix Model::load_matrix(const std::string& name) {
  const weights::TensorView& t = checkpoint_->tensor(name);  // shape already validated by Checkpoint
  return ops::Matrix{to_f32(t), t.n_rows(), t.n_cols()};
}

Model::Model(std::unique_ptr<weights::Checkpoint> checkpoint)
    : checkpoint_(std::move(checkpoint)), config_(checkpoint_->config()) {
  const weights::ModelConfig& c = config_;
  stored_type_ = std::string(weights::dtype_name(checkpoint_->tensor("model.layers.0.mlp.up_proj.weight").dtype));
  embed_ = load_matrix("model.embed_tokens.weight");
  layers_.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights& w = layers_[static_cast<size_t>(l)];
    w.attn_norm = load_vector(p + "input_layernorm.weight", c.n_embd);
    w.wq = load_matrix(p + "self_attn.q_proj.weight");
    w.wk = load_matrix(p + "self_attn.k_proj.weight");
    w.wv = load_matrix(p + "self_attn.v_proj.weight");
    w.wo = load_matrix(p + "self_attn.o_proj.weight");
    if (c.qkv_bias) {
      w.bq = load_vector(p + "self_attn.q_proj.bias", c.n_heads * c.head_dim);
      w.bk = load_vector(p + "self_attn.k_proj.bias", c.n_kv_heads * c.head_dim);
      w.bv = load_vector(p + "self_attn.v_proj.bias", c.n_kv_heads * c.head_dim);
    }
    w.ffn_norm = load_vector(p + "post_attention_layernorm.weight", c.n_embd);
    w.w_gate = load_matrix(p + "mlp.gate_proj.weight");
    w.w_up = load_matrix(p + "mlp.up_proj.weight");
    w.w_down = load_matrix(p + "mlp.down_proj.weight");
  }
  norm_ = load_vector("model.norm.weight", c.n_embd);
  const weights::TensorView* head = checkpoint_->find("lm_head.weight");
  lm_head_ = (c.tied_embeddings || head == nullptr) ? embed_ : load_matrix("lm_head.weight");
  spdlog::info("model: {} ({}), {} weights, {:.1f} MiB as f32", checkpoint_->path().string(), c.describe(),
               stored_type_, static_cast<double>(weight_bytes_) / (1 << 20));
}

Status Model::forward(std::span<const int32_t> tokens, KvCache& cache, ForwardContext& ctx, bool all_logits) const {
  if (tokens.empty()) return Status::empty_input;
  if (cache.n_past() + static_cast<int64_t>(tokens.size()) > cache.n_ctx()) return Status::context_full;
  for (int32_t id : tokens) {
    if (id < 0 || id >= config_.n_vocab) return Status::invalid_token;
  }
  const auto n = static_cast<int64_t>(tokens.size());
  ctx.reserve_logits(all_logits ? n : 1);
  for (int64_t start = 0; start < n; start += ctx.max_batch()) {
    const int64_t len = std::min(ctx.max_batch(), n - start);
    const bool last = start + len == n;
    float* out = all_logits ? ctx.logits_.data() + start * config_.n_vocab : (last ? ctx.logits_.data() : nullptr);
    forward_chunk(tokens.subspan(static_cast<size_t>(start), static_cast<size_t>(len)), cache, ctx, all_logits, out);
  }
  return Status::ok;
}

// One chunk of at most ctx.max_batch() tokens. n = tokens in the chunk,
// d = n_embd, p = cache.n_past() before the chunk.
Status Model::forward_chunk(std::span<const int32_t> tokens, KvCache& cache, ForwardContext& ctx, bool all_logits,
                            float* logits_out) const {
  const weights::ModelConfig& c = config_;
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t d = c.n_embd, q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  const int64_t p = cache.n_past();
  const ops::AttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim};

  float* x = ctx.x_.data();      // [n, d]      residual stream
  float* xb = ctx.xb_.data();    // [n, d]      normed input of a block
  float* xb2 = ctx.xb2_.data();  // [n, d]      block output before the residual add
  float* q = ctx.q_.data();      // [n, q_dim]  queries
  float* att = ctx.att_.data();  // [n, q_dim]  attention output, heads concatenated
  float* hb = ctx.hb_.data();    // [n, n_ff]   gate, then silu(gate) * up
  float* hb2 = ctx.hb2_.data();  // [n, n_ff]   up

  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(x + t * d, embed_.data + static_cast<int64_t>(tokens[t]) * d, static_cast<size_t>(d) * sizeof(float));
    ctx.positions_[t] = static_cast<int32_t>(p + t);
  }
  ops::rope_table(ctx.rope_, ctx.positions_.data(), n, c.head_dim, c.rope_theta);

  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = layers_[static_cast<size_t>(l)];
    float* k = cache.k(l);  // [n_ctx, kv_dim]; this chunk's rows start at p
    float* v = cache.v(l);

    // Attention block.
    ops::rmsnorm(xb, x, w.attn_norm, n, d, static_cast<float>(c.rms_eps));
    const ops::MatmulJob qkv[] = {{q, xb, w.wq}, {k + p * kv_dim, xb, w.wk}, {v + p * kv_dim, xb, w.wv}};
    ops::matmul_batch(qkv, n, ctx.pool_);
    if (w.bq != nullptr) {
      ops::add_rows(q, w.bq, n, q_dim);
      ops::add_rows(k + p * kv_dim, w.bk, n, kv_dim);
      ops::add_rows(v + p * kv_dim, w.bv, n, kv_dim);
    }
    ops::rope(q, n, c.n_heads, c.head_dim, q_dim, ctx.rope_, c.rope_layout);
    ops::rope(k + p * kv_dim, n, c.n_kv_heads, c.head_dim, kv_dim, ctx.rope_, c.rope_layout);
    ops::attention(att, q_dim, q, q_dim, k, v, kv_dim, n, p, shape, ctx.pool_);
    ops::matmul(xb2, att, w.wo, n, ctx.pool_);
    ops::add(x, xb2, n * d);

    // MLP block: down(silu(gate(h)) * up(h)).
    ops::rmsnorm(xb, x, w.ffn_norm, n, d, static_cast<float>(c.rms_eps));
    const ops::MatmulJob gate_up[] = {{hb, xb, w.w_gate}, {hb2, xb, w.w_up}};
    ops::matmul_batch(gate_up, n, ctx.pool_);
    ops::swiglu(hb, hb, hb2, n * c.n_ff);
    ops::matmul(xb2, hb, w.w_down, n, ctx.pool_);
    ops::add(x, xb2, n * d);
  }
  cache.advance(n);

  if (logits_out != nullptr) {
    // Only the rows whose logits are wanted go through the (large) LM head.
    const int64_t first = all_logits ? 0 : n - 1;
    const int64_t rows = n - first;
    ops::rmsnorm(xb, x + first * d, norm_, rows, d, static_cast<float>(c.rms_eps));
    ops::matmul(logits_out, xb, lm_head_, rows, ctx.pool_);  // [rows, n_vocab]
  }
  return Status::ok;
}

ForwardContext::ForwardContext(const Model& model, int n_threads, int64_t max_batch)
    : pool_(n_threads > 0 ? n_threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))),
      max_batch_(max_batch),
      n_vocab_(model.config().n_vocab) {
  if (max_batch <= 0) throw std::invalid_argument("max_batch must be positive");
  ops::init_blas();
  const weights::ModelConfig& c = model.config();
  const auto nb = static_cast<size_t>(max_batch);
  x_.resize(nb * c.n_embd);
  xb_.resize(nb * c.n_embd);
  xb2_.resize(nb * c.n_embd);
  q_.resize(nb * c.n_heads * c.head_dim);
  att_.resize(q_.size());
  hb_.resize(nb * c.n_ff);
  hb2_.resize(nb * c.n_ff);
  positions_.resize(nb);
  reserve_logits(1);
}

void ForwardContext::reserve_logits(int64_t n_rows) {
  if (logits_.size() < static_cast<size_t>(n_rows * n_vocab_)) logits_.resize(static_cast<size_t>(n_rows * n_vocab_));
  n_logits_ = n_rows;
}

}  // namespace llm::engine
