// Every kernel against a plain scalar loop written from its definition,
// including sizes that are not multiples of the vector width.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/ops.h"
#include "engine/thread_pool.h"

using namespace llm::engine;
using llm::weights::RopeLayout;

namespace {

std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

void check_close(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  double max_ref = 1e-30, max_err = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(want[i]));
    max_err = std::max(max_err, std::fabs(got[i] - want[i]));
  }
  CHECK(max_err <= tol * max_ref);
}

}  // namespace

TEST_CASE("matmul: decode kernel and SGEMM path against a scalar loop") {
  ThreadPool pool(2);
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{37, 45}, {64, 64}, {131, 96}, {16, 8}, {5, 3}}) {
    for (int64_t n : {1, 2, 3, 8, 9, 17}) {
      CAPTURE(rows);
      CAPTURE(cols);
      CAPTURE(n);
      const auto w = random_vector(static_cast<size_t>(rows * cols), 1);
      const auto x = random_vector(static_cast<size_t>(n * cols), 2);
      std::vector<float> y(static_cast<size_t>(n * rows), NAN);
      ops::matmul(y.data(), x.data(), ops::Matrix{w.data(), rows, cols}, n, pool);
      std::vector<double> ref(y.size());
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
          double s = 0;
          for (int64_t c = 0; c < cols; ++c) s += static_cast<double>(w[r * cols + c]) * x[t * cols + c];
          ref[t * rows + r] = s;
        }
      }
      check_close(y, ref, 1e-5);
    }
  }
}

TEST_CASE("rmsnorm against a scalar loop") {
  for (int64_t d : {1, 7, 64, 129}) {
    const int64_t n = 3;
    const auto x = random_vector(static_cast<size_t>(n * d), 3, 5.0f);
    const auto w = random_vector(static_cast<size_t>(d), 4);
    std::vector<float> y(x.size());
    ops::rmsnorm(y.data(), x.data(), w.data(), n, d, 1e-5f);
    std::vector<double> ref(x.size());
    for (int64_t r = 0; r < n; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[r * d + i]) * x[r * d + i];
      const double inv = 1.0 / std::sqrt(ss / d + 1e-5);
      for (int64_t i = 0; i < d; ++i) ref[r * d + i] = x[r * d + i] * inv * w[i];
    }
    check_close(y, ref, 1e-6);
    // In place gives the same.
    std::vector<float> z = x;
    ops::rmsnorm(z.data(), z.data(), w.data(), n, d, 1e-5f);
    CHECK(z == y);
  }
}

TEST_CASE("softmax is stable for large logits and sums to one") {
  std::vector<float> x = {1000.0f, 999.0f, -1000.0f, 998.5f, 1000.0f};
  ops::softmax(x.data(), static_cast<int64_t>(x.size()));
  double z = std::exp(0.0) * 2 + std::exp(-1.0) + std::exp(-1.5) + std::exp(-2000.0);
  CHECK(x[0] == doctest::Approx(1.0 / z).epsilon(1e-6));
  CHECK(x[1] == doctest::Approx(std::exp(-1.0) / z).epsilon(1e-6));
  CHECK(x[2] == 0.0f);
  double sum = 0;
  for (float v : x) sum += v;
  CHECK(sum == doctest::Approx(1.0).epsilon(1e-6));
}

TEST_CASE("swiglu, add, dot and axpy against scalar loops") {
  for (int64_t n : {1, 7, 8, 33}) {
    const auto g = random_vector(static_cast<size_t>(n), 5, 6.0f);
    const auto u = random_vector(static_cast<size_t>(n), 6);
    std::vector<float> out(static_cast<size_t>(n));
    ops::swiglu(out.data(), g.data(), u.data(), n);
    std::vector<double> ref(out.size());
    for (int64_t i = 0; i < n; ++i) ref[i] = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
    check_close(out, ref, 1e-6);

    double d = 0;
    for (int64_t i = 0; i < n; ++i) d += static_cast<double>(g[i]) * u[i];
    CHECK(ops::dot(g.data(), u.data(), n) == doctest::Approx(d).epsilon(1e-5));

    std::vector<float> y = u;
    ops::axpy(y.data(), 0.5f, g.data(), n);
    for (int64_t i = 0; i < n; ++i) CHECK(y[i] == doctest::Approx(u[i] + 0.5 * g[i]).epsilon(1e-6));
  }
}

TEST_CASE("rope: both layouts against the rotation formula, at several positions") {
  const int64_t n_heads = 3, head_dim = 10, stride = 34;  // stride > n_heads * head_dim: padding untouched
  const double theta = 10000.0;
  const std::vector<int32_t> pos = {0, 1, 17, 511};
  const auto n = static_cast<int64_t>(pos.size());
  ops::RopeTable table;
  ops::rope_table(table, pos.data(), n, head_dim, theta);
  for (RopeLayout layout : {RopeLayout::rotate_half, RopeLayout::interleaved}) {
    auto x = random_vector(static_cast<size_t>(n * stride), 7);
    const auto orig = x;
    ops::rope(x.data(), n, n_heads, head_dim, stride, table, layout);
    std::vector<double> ref(orig.begin(), orig.end());
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < n_heads; ++h) {
        for (int64_t i = 0; i < head_dim / 2; ++i) {
          const double angle = pos[t] * std::pow(theta, -2.0 * i / head_dim);
          const int64_t a = layout == RopeLayout::rotate_half ? i : 2 * i;
          const int64_t b = layout == RopeLayout::rotate_half ? i + head_dim / 2 : 2 * i + 1;
          const int64_t base = t * stride + h * head_dim;
          ref[base + a] = orig[base + a] * std::cos(angle) - orig[base + b] * std::sin(angle);
          ref[base + b] = orig[base + a] * std::sin(angle) + orig[base + b] * std::cos(angle);
        }
      }
    }
    check_close(x, ref, 1e-6);
  }
}

TEST_CASE("attention: causal GQA (MHA, GQA, MQA) against a scalar loop, decode and prefill paths") {
  ThreadPool pool(2);
  struct Case {
    int64_t n_heads, n_kv_heads, head_dim;
  };
  for (const Case& c : {Case{4, 4, 8}, Case{6, 2, 16}, Case{4, 1, 5}}) {
    for (const auto& [n_tokens, n_past] : {std::pair<int64_t, int64_t>{1, 0}, {1, 9}, {5, 3}, {13, 0}, {21, 7}}) {
      CAPTURE(c.n_heads);
      CAPTURE(c.n_kv_heads);
      CAPTURE(n_tokens);
      CAPTURE(n_past);
      const int64_t q_stride = c.n_heads * c.head_dim + 3, kv_stride = c.n_kv_heads * c.head_dim + 1;
      const int64_t out_stride = c.n_heads * c.head_dim;
      const int64_t n_keys = n_past + n_tokens;
      const auto q = random_vector(static_cast<size_t>(n_tokens * q_stride), 11, 2.0f);
      const auto k = random_vector(static_cast<size_t>(n_keys * kv_stride), 12, 2.0f);
      const auto v = random_vector(static_cast<size_t>(n_keys * kv_stride), 13);
      std::vector<float> out(static_cast<size_t>(n_tokens * out_stride), NAN);
      ops::attention(out.data(), out_stride, q.data(), q_stride, k.data(), v.data(), kv_stride, n_tokens, n_past,
                     ops::AttentionShape{c.n_heads, c.n_kv_heads, c.head_dim}, pool);
      std::vector<double> ref(out.size());
      const int64_t group = c.n_heads / c.n_kv_heads;
      for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t h = 0; h < c.n_heads; ++h) {
          const int64_t g = h / group;
          const int64_t visible = n_past + t + 1;
          std::vector<double> s(static_cast<size_t>(visible));
          double max = -INFINITY;
          for (int64_t j = 0; j < visible; ++j) {
            double d = 0;
            for (int64_t i = 0; i < c.head_dim; ++i) {
              d += static_cast<double>(q[t * q_stride + h * c.head_dim + i]) * k[j * kv_stride + g * c.head_dim + i];
            }
            s[j] = d / std::sqrt(static_cast<double>(c.head_dim));
            max = std::max(max, s[j]);
          }
          double z = 0;
          for (double& e : s) z += (e = std::exp(e - max));
          for (int64_t i = 0; i < c.head_dim; ++i) {
            double acc = 0;
            for (int64_t j = 0; j < visible; ++j) acc += s[j] / z * v[j * kv_stride + g * c.head_dim + i];
            ref[t * out_stride + h * c.head_dim + i] = acc;
          }
        }
      }
      check_close(out, ref, 1e-5);
    }
  }
}

TEST_CASE("thread pool covers every index exactly once") {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 5, 1000}) {
      std::vector<int> hits(static_cast<size_t>(n), 0);
      pool.parallel_for(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) ++hits[static_cast<size_t>(i)];
      });
      for (int h : hits) CHECK(h == 1);
    }
  }
}
