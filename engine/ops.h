#pragma once
// The numeric kernels of the decoder, on f32 row-major buffers. Each has a
// plain scalar reference in tests/engine/test_ops.cpp.
#include <cstdint>
#include <span>
#include <vector>

#include "weights/model_config.h"

namespace llm::engine {
class ThreadPool;
}

namespace llm::engine::ops {

// A row-major f32 matrix [rows, cols]; a Linear weight is [out, in].
struct Matrix {
  const float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};

// y[n, w.rows] = x[n, w.cols] · wᵀ. The rows of w are split across the pool's
// threads: few tokens (decode) go through a bandwidth-bound AVX2 kernel that
// reads w once; many tokens (prefill) through single-threaded OpenBLAS SGEMM
// per slice, so all threading is the pool's own and nothing oversubscribes.
void matmul(float* y, const float* x, const Matrix& w, int64_t n, ThreadPool& pool);

// Several products of the same input rows in one parallel region (q/k/v,
// gate/up): one thread hand-off instead of one per matrix.
struct MatmulJob {
  float* y;         // [n, w.rows]
  const float* x;   // [n, w.cols]
  Matrix w;
};
void matmul_batch(std::span<const MatmulJob> jobs, int64_t n, ThreadPool& pool);

// Makes OpenBLAS single-threaded (the pool owns the cores). Called by the engine at start-up.
void init_blas();

// y[i, :] = x[i, :] / sqrt(mean(x[i, :]²) + eps) * w, for n rows of d; y may alias x.
void rmsnorm(float* y, const float* x, const float* w, int64_t n, int64_t d, float eps);

// y[i, :] += b for n rows of d (biases).
void add_rows(float* y, const float* b, int64_t n, int64_t d);
// y += x over n elements (residuals).
void add(float* y, const float* x, int64_t n);
// out = silu(gate) * up elementwise; out may alias gate.
void swiglu(float* out, const float* gate, const float* up, int64_t n);
// In-place numerically stable softmax over n values.
void softmax(float* x, int64_t n);

float dot(const float* a, const float* b, int64_t n);
void axpy(float* y, float a, const float* x, int64_t n);  // y += a * x

// cos/sin of pos * theta^(-2i/head_dim) for each token, computed in double.
struct RopeTable {
  int64_t n_tokens = 0;
  int64_t half = 0;  // head_dim / 2
  std::vector<float> cos, sin;  // [n_tokens, half]
};
void rope_table(RopeTable& table, const int32_t* positions, int64_t n_tokens, int64_t head_dim, double theta);

// Rotates each head of x[n_tokens, row_stride] (heads of head_dim packed from column 0).
//   rotate_half: pairs (i, i + head_dim/2);  interleaved: pairs (2i, 2i + 1).
void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t row_stride, const RopeTable& table,
          weights::RopeLayout layout);

struct AttentionShape {
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
};

// Causal grouped-query attention for one sequence.
//   q:   [n_tokens, q_stride], query heads packed from column 0
//   k,v: [n_past + n_tokens, kv_stride], the cache including this batch's rows
//   out: [n_tokens, out_stride]
// Token t sits at position n_past + t and attends to cache rows [0, n_past + t].
// Query head h reads KV head h / (n_heads / n_kv_heads).
void attention(float* out, int64_t out_stride, const float* q, int64_t q_stride, const float* k, const float* v,
               int64_t kv_stride, int64_t n_tokens, int64_t n_past, const AttentionShape& shape, ThreadPool& pool);

}  // namespace llm::engine::ops
