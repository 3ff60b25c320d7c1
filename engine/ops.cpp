#include "engine/ops.h"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <stdexcept>
#include <cmath>
#include <limits>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LLM_AVX2 1
#endif

#include "engine/thread_pool.h"

namespace llm::engine::ops {

void init_blas() { openblas_set_num_threads(1); }

namespace {

constexpr int64_t k_gemv_max_tokens = 8;

// y[t, r] = dot(w[r, :], x[t, :]) for rows [r0, r1) and n tokens; w is read
// once, four rows at a time, while the x rows stay in L1.
void gemv_rows(float* y, const float* x, const Matrix& w, int64_t n, int64_t r0, int64_t r1) {
  const int64_t cols = w.cols;
  int64_t r = r0;
#ifdef LLM_AVX2
  if (cols % 8 == 0) {
    for (; r + 4 <= r1; r += 4) {
      const float* w0 = w.data + r * cols;
      const float* w1 = w0 + cols;
      const float* w2 = w1 + cols;
      const float* w3 = w2 + cols;
      for (int64_t t = 0; t < n; ++t) {
        const float* xt = x + t * cols;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        for (int64_t c = 0; c < cols; c += 8) {
          const __m256 xv = _mm256_loadu_ps(xt + c);
          a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + c), xv, a0);
          a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + c), xv, a1);
          a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + c), xv, a2);
          a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + c), xv, a3);
        }
        // Horizontal sums of the four accumulators at once.
        const __m256 s01 = _mm256_hadd_ps(a0, a1);
        const __m256 s23 = _mm256_hadd_ps(a2, a3);
        const __m256 s = _mm256_hadd_ps(s01, s23);
        const __m128 sum = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        _mm_storeu_ps(y + t * w.rows + r, sum);
      }
    }
  }
#endif
  for (; r < r1; ++r) {
    for (int64_t t = 0; t < n; ++t) y[t * w.rows + r] = dot(w.data + r * cols, x + t * cols, cols);
  }
}

// Rows [r0, r1) of one product, by the kernel that suits n.
void matmul_rows(const MatmulJob& job, int64_t n, int64_t r0, int64_t r1) {
  if (r0 >= r1) return;
  if (n <= k_gemv_max_tokens) {
    gemv_rows(job.y, job.x, job.w, n, r0, r1);
  } else {
    const Matrix& w = job.w;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(n), static_cast<blasint>(r1 - r0),
                static_cast<blasint>(w.cols), 1.0f, job.x, static_cast<blasint>(w.cols), w.data + r0 * w.cols,
                static_cast<blasint>(w.cols), 0.0f, job.y + r0, static_cast<blasint>(w.rows));
  }
}

}  // namespace

void matmul_batch(std::span<const MatmulJob> jobs, int64_t n, ThreadPool& pool) {
  // The rows of all products form one range of 16-row blocks, split evenly
  // across threads; a thread's share may cover the end of one product and the
  // start of the next.
  constexpr int64_t k_block = 16;
  std::array<int64_t, 8> first_block{};
  if (jobs.size() >= first_block.size()) throw std::invalid_argument("matmul_batch: too many jobs");
  int64_t n_blocks = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    first_block[j] = n_blocks;
    n_blocks += (jobs[j].w.rows + k_block - 1) / k_block;
  }
  first_block[jobs.size()] = n_blocks;
  pool.parallel_for(n_blocks, [&](int64_t b0, int64_t b1) {
    for (size_t j = 0; j < jobs.size(); ++j) {
      const int64_t lo = std::max(b0, first_block[j]), hi = std::min(b1, first_block[j + 1]);
      if (lo >= hi) continue;
      const int64_t rows = jobs[j].w.rows;
      matmul_rows(jobs[j], n, (lo - first_block[j]) * k_block, std::min(rows, (hi - first_block[j]) * k_block));
    }
  });
}

void matmul(float* y, const float* x, const Matrix& w, int64_t n, ThreadPool& pool) {
  const MatmulJob job{y, x, w};
  matmul_batch(std::span<const MatmulJob>(&job, 1), n, pool);
}

float dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float sum = 0.0f;
#ifdef LLM_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  const __m256 acc = _mm256_add_ps(acc0, acc1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  sum = _mm_cvtss_f32(s);
#endif
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void axpy(float* y, float a, const float* x, int64_t n) {
  int64_t i = 0;
#ifdef LLM_AVX2
  const __m256 va = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
#endif
  for (; i < n; ++i) y[i] += a * x[i];
}

void rmsnorm(float* y, const float* x, const float* w, int64_t n, int64_t d, float eps) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * d;
    float* yr = y + r * d;
    // Accumulate in double: d is up to thousands and the result feeds every layer.
    double ss = 0.0;
    for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
    for (int64_t i = 0; i < d; ++i) yr[i] = xr[i] * scale * w[i];
  }
}

void add_rows(float* y, const float* b, int64_t n, int64_t d) {
  for (int64_t r = 0; r < n; ++r) add(y + r * d, b, d);
}

void add(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void swiglu(float* out, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void softmax(float* x, int64_t n) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max = std::max(max, x[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void rope_table(RopeTable& t, const int32_t* positions, int64_t n_tokens, int64_t head_dim, double theta) {
  t.n_tokens = n_tokens;
  t.half = head_dim / 2;
  t.cos.resize(static_cast<size_t>(n_tokens * t.half));
  t.sin.resize(t.cos.size());
  for (int64_t i = 0; i < t.half; ++i) {
    const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    for (int64_t tok = 0; tok < n_tokens; ++tok) {
      const double angle = positions[tok] * inv_freq;
      t.cos[tok * t.half + i] = static_cast<float>(std::cos(angle));
      t.sin[tok * t.half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t row_stride, const RopeTable& table,
          weights::RopeLayout layout) {
  const int64_t half = head_dim / 2;
  // Pair (a, b) of element i: rotate_half uses (i, i + half), interleaved uses (2i, 2i + 1).
  const int64_t a_step = layout == weights::RopeLayout::rotate_half ? 1 : 2;
  const int64_t b_off = layout == weights::RopeLayout::rotate_half ? half : 1;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* c = table.cos.data() + t * half;
    const float* s = table.sin.data() + t * half;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + t * row_stride + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        float& a = v[i * a_step];
        float& b = v[i * a_step + b_off];
        const float a0 = a, b0 = b;
        a = a0 * c[i] - b0 * s[i];
        b = a0 * s[i] + b0 * c[i];
      }
    }
  }
}

namespace {

// Few query rows (decode): per (token, head) pair, dot products against the cache.
void attention_rows(float* out, int64_t out_stride, const float* q, int64_t q_stride, const float* k, const float* v,
                    int64_t kv_stride, int64_t n_tokens, int64_t n_past, const AttentionShape& s, ThreadPool& pool) {
  const int64_t group = s.n_heads / s.n_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  pool.parallel_for(n_tokens * s.n_heads, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
    for (int64_t job = begin; job < end; ++job) {
      const int64_t t = job / s.n_heads, h = job % s.n_heads, g = h / group;
      const int64_t n_keys = n_past + t + 1;
      scores.resize(static_cast<size_t>(n_keys));
      const float* qh = q + t * q_stride + h * s.head_dim;
      for (int64_t j = 0; j < n_keys; ++j) scores[j] = dot(qh, k + j * kv_stride + g * s.head_dim, s.head_dim) * scale;
      softmax(scores.data(), n_keys);
      float* oh = out + t * out_stride + h * s.head_dim;
      std::fill(oh, oh + s.head_dim, 0.0f);
      for (int64_t j = 0; j < n_keys; ++j) axpy(oh, scores[j], v + j * kv_stride + g * s.head_dim, s.head_dim);
    }
  });
}

// Many query rows (prefill): per head, S = Q Kᵀ and O = softmax(S) V as
// single-threaded GEMMs, heads spread over the pool.
void attention_gemm(float* out, int64_t out_stride, const float* q, int64_t q_stride, const float* k, const float* v,
                    int64_t kv_stride, int64_t n_tokens, int64_t n_past, const AttentionShape& s, ThreadPool& pool) {
  const int64_t group = s.n_heads / s.n_kv_heads;
  const int64_t n_keys = n_past + n_tokens;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const auto hd = static_cast<blasint>(s.head_dim);
  pool.parallel_for(s.n_heads, [&](int64_t h0, int64_t h1) {
    thread_local std::vector<float> scores;  // [n_tokens, n_keys], this thread's own
    scores.resize(static_cast<size_t>(n_tokens * n_keys));
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t g = h / group;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(n_tokens),
                  static_cast<blasint>(n_keys), hd, scale, q + h * s.head_dim, static_cast<blasint>(q_stride),
                  k + g * s.head_dim, static_cast<blasint>(kv_stride), 0.0f, scores.data(),
                  static_cast<blasint>(n_keys));
      for (int64_t t = 0; t < n_tokens; ++t) {
        float* row = scores.data() + t * n_keys;
        const int64_t visible = n_past + t + 1;
        softmax(row, visible);
        std::fill(row + visible, row + n_keys, 0.0f);  // causal mask
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(n_tokens), hd,
                  static_cast<blasint>(n_keys), 1.0f, scores.data(), static_cast<blasint>(n_keys), v + g * s.head_dim,
                  static_cast<blasint>(kv_stride), 0.0f, out + h * s.head_dim, static_cast<blasint>(out_stride));
    }
  });
}

}  // namespace

void attention(float* out, int64_t out_stride, const float* q, int64_t q_stride, const float* k, const float* v,
               int64_t kv_stride, int64_t n_tokens, int64_t n_past, const AttentionShape& shape, ThreadPool& pool) {
  // Below a few rows the GEMM set-up costs more than it saves.
  if (n_tokens < 8) {
    attention_rows(out, out_stride, q, q_stride, k, v, kv_stride, n_tokens, n_past, shape, pool);
  } else {
    attention_gemm(out, out_stride, q, q_stride, k, v, kv_stride, n_tokens, n_past, shape, pool);
  }
}

}  // namespace llm::engine::ops
