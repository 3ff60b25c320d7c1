// Element-type conversions against independent references: f16/bf16 decoded
// from their definitions, quantized blocks built by hand from the ggml layouts.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "weights/dtype.h"

using namespace llm::weights;

namespace {

float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE half decoded from its definition, in double precision.
double f16_reference(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int e = (h >> 10) & 31;
  const int m = h & 1023;
  if (e == 0) return sign * std::ldexp(m, -24);
  if (e == 31) return m ? NAN : sign * INFINITY;
  return sign * std::ldexp(1.0 + m / 1024.0, e - 15);
}

// Nearest representable value by brute force over candidates, ties to even.
uint16_t nearest_f16(float x) {
  uint16_t best = 0;
  double best_err = INFINITY;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const double v = f16_reference(static_cast<uint16_t>(h));
    if (std::isnan(v) || std::isinf(v)) continue;
    const double err = std::fabs(v - x);
    if (err < best_err || (err == best_err && (h & 1) == 0)) {
      best_err = err;
      best = static_cast<uint16_t>(h);
    }
  }
  return best;
}

std::vector<std::byte> bytes(std::initializer_list<int> v) {
  std::vector<std::byte> out;
  for (int x : v) out.push_back(static_cast<std::byte>(x));
  return out;
}

}  // namespace

TEST_CASE("f16 decodes every bit pattern as IEEE binary16") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const double ref = f16_reference(static_cast<uint16_t>(h));
    const float got = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(ref)) {
      CHECK(std::isnan(got));
    } else {
      CHECK(static_cast<double>(got) == ref);
    }
  }
}

TEST_CASE("f32 -> f16 rounds to nearest even and round-trips every half") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    CHECK(f32_to_f16(f) == h);
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mag(-20.0f, 16.0f);
  for (int i = 0; i < 300; ++i) {
    const float x = std::exp2(mag(rng)) * ((i & 1) ? -1.0f : 1.0f);
    CHECK(f32_to_f16(x) == nearest_f16(x));
  }
  // Exact midpoints between neighbours go to the even mantissa.
  CHECK(f32_to_f16(1.0f + 1.0f / 2048.0f) == 0x3C00);          // between 0x3C00 and 0x3C01
  CHECK(f32_to_f16(1.0f + 3.0f / 2048.0f) == 0x3C02);          // between 0x3C01 and 0x3C02
  CHECK(f32_to_f16(65520.0f) == 0x7C00);                        // rounds to infinity
  CHECK(f32_to_f16(std::ldexp(1.0f, -25)) == 0x0000);          // half the smallest subnormal
  CHECK(f32_to_f16(std::ldexp(1.5f, -25)) == 0x0001);
}

TEST_CASE("bf16 is the top half of f32, rounded to nearest even") {
  CHECK(bf16_to_f32(0x3F80) == 1.0f);
  CHECK(bf16_to_f32(0xC040) == -3.0f);
  CHECK(f32_to_bf16(1.0f) == 0x3F80);
  CHECK(f32_to_bf16(bits_to_f32(0x3F808000)) == 0x3F80);  // tie, even stays
  CHECK(f32_to_bf16(bits_to_f32(0x3F818000)) == 0x3F82);  // tie, odd rounds up
  CHECK(f32_to_bf16(bits_to_f32(0x3F808001)) == 0x3F81);
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1000.0f, 1000.0f);
  for (int i = 0; i < 10000; ++i) {
    const float x = dist(rng);
    const uint16_t b = f32_to_bf16(x);
    const double err = std::fabs(static_cast<double>(bf16_to_f32(b)) - x);
    // No neighbour is closer.
    CHECK(err <= std::fabs(static_cast<double>(bf16_to_f32(static_cast<uint16_t>(b + 1))) - x));
    CHECK(err <= std::fabs(static_cast<double>(bf16_to_f32(static_cast<uint16_t>(b - 1))) - x));
  }
}

TEST_CASE("block sizes") {
  CHECK(dtype_bytes(DType::f32, 10) == 40u);
  CHECK(dtype_bytes(DType::bf16, 3) == 6u);
  CHECK(dtype_bytes(DType::q8_0, 64) == 68u);
  CHECK(dtype_bytes(DType::q4_0, 32) == 18u);
  CHECK(dtype_bytes(DType::q4_k, 512) == 288u);
  CHECK(dtype_bytes(DType::q6_k, 256) == 210u);
  CHECK_FALSE(dtype_bytes(DType::q8_0, 33).has_value());
  CHECK(dtype_from_name("q4_0") == DType::q4_0);
  CHECK_FALSE(dtype_from_name("q5_1").has_value());
}

TEST_CASE("Q8_0 round trip stays within half a quantization step") {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  const int64_t n = 32 * 37;
  std::vector<float> x(n), y(n);
  for (float& v : x) v = dist(rng);
  x[5] = 0.0f;
  std::vector<std::byte> q(*dtype_bytes(DType::q8_0, n));
  quantize_q8_0(x.data(), q.data(), n);
  to_f32(DType::q8_0, q.data(), y.data(), n);
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    uint16_t dh;
    std::memcpy(&dh, q.data() + b * 34, 2);
    const float d = f16_to_f32(dh);
    CHECK(d == doctest::Approx(amax / 127.0f).epsilon(1e-3));
    for (int i = 0; i < 32; ++i) {
      // Half a step, plus the error of storing d in f16 (relative 2^-11) times 127 steps.
      CHECK(std::fabs(y[b * 32 + i] - x[b * 32 + i]) <= d * 0.5f + amax * 1e-3f);
    }
  }
  // All zeros stay zero (no division by zero).
  std::vector<float> zeros(32, 0.0f), back(32, 1.0f);
  quantize_q8_0(zeros.data(), q.data(), 32);
  to_f32(DType::q8_0, q.data(), back.data(), 32);
  for (float v : back) CHECK(v == 0.0f);
}

TEST_CASE("Q4_0 dequantizes the ggml layout and round-trips within one step") {
  // Hand-built block: d = 0.5, nibble i holds i for the low half and 15 - i for the high half.
  std::vector<std::byte> block(18);
  const uint16_t d = f32_to_f16(0.5f);
  std::memcpy(block.data(), &d, 2);
  for (int i = 0; i < 16; ++i) block[2 + i] = static_cast<std::byte>(i | ((15 - i) << 4));
  std::vector<float> y(32);
  to_f32(DType::q4_0, block.data(), y.data(), 32);
  for (int i = 0; i < 16; ++i) {
    CHECK(y[i] == 0.5f * static_cast<float>(i - 8));
    CHECK(y[i + 16] == 0.5f * static_cast<float>(15 - i - 8));
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  std::vector<float> x(64), back(64);
  for (float& v : x) v = dist(rng);
  std::vector<std::byte> q(*dtype_bytes(DType::q4_0, 64));
  quantize_q4_0(x.data(), q.data(), 64);
  to_f32(DType::q4_0, q.data(), back.data(), 64);
  // The largest magnitude maps to -8 steps, so the opposite extreme clamps at +7: one step of error at most.
  for (int b = 0; b < 2; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    for (int i = 0; i < 32; ++i) CHECK(std::fabs(back[b * 32 + i] - x[b * 32 + i]) <= amax / 8.0f + 1e-3f * amax + 1e-6f);
  }
}

TEST_CASE("Q6_K dequantizes the ggml layout") {
  // 256 values as 6-bit codes q (0..63) with 16 int8 scales, one per 16 values:
  // value = d * scale[i / 16] * (q - 32). Packed as ggml does: for each half of 128
  // values, ql holds low nibbles of (l, l+32) and (l+64, l+96), qh two bits each.
  std::vector<int> code(256);
  std::vector<int> scale(16);
  for (int i = 0; i < 256; ++i) code[i] = (i * 7 + 3) % 64;
  for (int s = 0; s < 16; ++s) scale[s] = s % 2 ? -(s + 1) : s + 2;
  std::vector<std::byte> block(210, std::byte{0});
  auto* ql = reinterpret_cast<uint8_t*>(block.data());
  auto* qh = ql + 128;
  auto* sc = reinterpret_cast<int8_t*>(block.data() + 192);
  for (int half = 0; half < 2; ++half) {
    for (int l = 0; l < 32; ++l) {
      const int base = half * 128;
      const int q1 = code[base + l], q2 = code[base + l + 32], q3 = code[base + l + 64], q4 = code[base + l + 96];
      ql[half * 64 + l] = static_cast<uint8_t>((q1 & 15) | ((q3 & 15) << 4));
      ql[half * 64 + l + 32] = static_cast<uint8_t>((q2 & 15) | ((q4 & 15) << 4));
      qh[half * 32 + l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
    }
  }
  for (int s = 0; s < 16; ++s) sc[s] = static_cast<int8_t>(scale[s]);
  const uint16_t d = f32_to_f16(0.25f);
  std::memcpy(block.data() + 208, &d, 2);
  std::vector<float> y(256);
  to_f32(DType::q6_k, block.data(), y.data(), 256);
  for (int i = 0; i < 256; ++i) {
    CHECK(y[i] == 0.25f * static_cast<float>(scale[i / 16]) * static_cast<float>(code[i] - 32));
  }
}

TEST_CASE("Q4_K dequantizes the ggml layout") {
  // 8 sub-blocks of 32 values with 6-bit scale s and min m:
  // value = d * s * q - dmin * m, q a 4-bit code. Scales/mins packed in 12 bytes:
  // j < 4: s = b[j] & 63, m = b[j+4] & 63; j >= 4: low 4 bits in b[j+4], high 2 bits in b[j-4] / b[j] top bits.
  std::vector<int> s = {1, 63, 17, 40, 5, 62, 33, 12};
  std::vector<int> m = {0, 7, 63, 21, 48, 3, 30, 59};
  std::vector<uint8_t> packed(12, 0);
  for (int j = 0; j < 4; ++j) {
    packed[j] = static_cast<uint8_t>(s[j] | ((s[j + 4] >> 4) << 6));
    packed[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    packed[j + 8] = static_cast<uint8_t>((s[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
  std::vector<int> code(256);
  for (int i = 0; i < 256; ++i) code[i] = (i * 5 + 1) % 16;
  std::vector<std::byte> block(144, std::byte{0});
  const uint16_t d = f32_to_f16(0.125f), dmin = f32_to_f16(0.0625f);
  std::memcpy(block.data(), &d, 2);
  std::memcpy(block.data() + 2, &dmin, 2);
  std::memcpy(block.data() + 4, packed.data(), 12);
  auto* qs = reinterpret_cast<uint8_t*>(block.data() + 16);
  // Each 32-byte chunk of qs holds sub-block 2k in low nibbles and 2k+1 in high nibbles.
  for (int k = 0; k < 4; ++k) {
    for (int l = 0; l < 32; ++l) {
      qs[k * 32 + l] = static_cast<uint8_t>(code[k * 64 + l] | (code[k * 64 + 32 + l] << 4));
    }
  }
  std::vector<float> y(256);
  to_f32(DType::q4_k, block.data(), y.data(), 256);
  for (int i = 0; i < 256; ++i) {
    const int j = i / 32;
    CHECK(y[i] == doctest::Approx(0.125 * s[j] * code[i] - 0.0625 * m[j]).epsilon(1e-6));
  }
}

TEST_CASE("to_f32 rejects a partial block") {
  std::vector<std::byte> q = bytes({0, 0});
  std::vector<float> y(40);
  CHECK_THROWS_AS(to_f32(DType::q8_0, q.data(), y.data(), 40), std::invalid_argument);
}
