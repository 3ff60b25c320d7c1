#include "weights/dtype.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>
#include <string>

namespace llm::weights {

namespace {

// ggml block layouts (little-endian, packed):
//   q8_0: f16 d, int8 q[32]                          value = d * q
//   q4_0: f16 d, uint8 qs[16]                        value = d * (nibble - 8); low nibbles are 0..15, high 16..31
//   q4_k: f16 d, f16 dmin, uint8 scales[12], qs[128] 8 sub-blocks of 32 with 6-bit scale/min
//   q6_k: uint8 ql[128], qh[64], int8 scales[16], f16 d
constexpr std::array<DTypeInfo, 7> k_infos = {{
    {"f32", 1, 4},
    {"f16", 1, 2},
    {"bf16", 1, 2},
    {"q8_0", 32, 34},
    {"q4_0", 32, 18},
    {"q4_k", 256, 144},
    {"q6_k", 256, 210},
}};

uint16_t load_u16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

void dequant_q8_0(const std::byte* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += 34, dst += 32) {
    const float d = f16_to_f32(load_u16(src));
    const auto* q = reinterpret_cast<const int8_t*>(src + 2);
    for (int i = 0; i < 32; ++i) dst[i] = d * static_cast<float>(q[i]);
  }
}

void dequant_q4_0(const std::byte* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += 18, dst += 32) {
    const float d = f16_to_f32(load_u16(src));
    const auto* qs = reinterpret_cast<const uint8_t*>(src + 2);
    for (int i = 0; i < 16; ++i) {
      dst[i] = d * static_cast<float>((qs[i] & 0x0F) - 8);
      dst[i + 16] = d * static_cast<float>((qs[i] >> 4) - 8);
    }
  }
}

// The 12 scale bytes of a q4_k block pack eight 6-bit scales and eight 6-bit mins.
void q4_k_scale_min(int j, const uint8_t* s, uint8_t& scale, uint8_t& min) {
  if (j < 4) {
    scale = s[j] & 63;
    min = s[j + 4] & 63;
  } else {
    scale = static_cast<uint8_t>((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
    min = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

void dequant_q4_k(const std::byte* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += 144) {
    const float d = f16_to_f32(load_u16(src));
    const float dmin = f16_to_f32(load_u16(src + 2));
    const auto* scales = reinterpret_cast<const uint8_t*>(src + 4);
    const auto* q = reinterpret_cast<const uint8_t*>(src + 16);
    for (int j = 0; j < 8; j += 2, q += 32) {
      uint8_t sc = 0, m = 0;
      q4_k_scale_min(j, scales, sc, m);
      const float d1 = d * sc, m1 = dmin * m;
      q4_k_scale_min(j + 1, scales, sc, m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *dst++ = d1 * static_cast<float>(q[l] & 0x0F) - m1;
      for (int l = 0; l < 32; ++l) *dst++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void dequant_q6_k(const std::byte* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += 210) {
    const auto* ql = reinterpret_cast<const uint8_t*>(src);
    const auto* qh = reinterpret_cast<const uint8_t*>(src + 128);
    const auto* sc = reinterpret_cast<const int8_t*>(src + 192);
    const float d = f16_to_f32(load_u16(src + 208));
    for (int half = 0; half < 2; ++half, dst += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        dst[l] = d * sc[is] * static_cast<float>(q1);
        dst[l + 32] = d * sc[is + 2] * static_cast<float>(q2);
        dst[l + 64] = d * sc[is + 4] * static_cast<float>(q3);
        dst[l + 96] = d * sc[is + 6] * static_cast<float>(q4);
      }
    }
  }
}

}  // namespace

const DTypeInfo& dtype_info(DType t) { return k_infos.at(static_cast<size_t>(t)); }
std::string_view dtype_name(DType t) { return dtype_info(t).name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (size_t i = 0; i < k_infos.size(); ++i) {
    if (k_infos[i].name == name) return static_cast<DType>(i);
  }
  return std::nullopt;
}

std::optional<size_t> dtype_bytes(DType t, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  if (n < 0 || n % info.block_size != 0) return std::nullopt;
  return static_cast<size_t>(n / info.block_size) * info.block_bytes;
}

uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3FFu) << 13;
    }
  } else if (exp == 0x1F) {
    u = sign | 0x7F800000u | mant << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return sign | 0x7E00u;        // NaN
  if (abs >= 0x477FF000u) return sign | 0x7C00u;       // overflow (incl. inf) after rounding
  if (abs < 0x38800000u) {                             // subnormal or zero in f16
    if (abs < 0x33000000u) return sign;                // rounds to zero
    const uint32_t e = abs >> 23;
    const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - e;                    // 14 + (112 - e)
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t v = abs - (112u << 23);                     // rebias exponent 127 -> 15
  v += 0xFFFu + ((v >> 13) & 1u);                      // round to nearest even
  return static_cast<uint16_t>(sign | (v >> 13));
}

void to_f32(DType t, const std::byte* src, float* dst, int64_t n) {
  const int64_t block = dtype_info(t).block_size;
  if (n % block != 0) {
    throw std::invalid_argument("to_f32: " + std::to_string(n) + " elements is not a whole number of " +
                                std::string(dtype_name(t)) + " blocks");
  }
  switch (t) {
    case DType::f32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(load_u16(src + 2 * i));
      return;
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
      return;
    case DType::q8_0: return dequant_q8_0(src, dst, n / block);
    case DType::q4_0: return dequant_q4_0(src, dst, n / block);
    case DType::q4_k: return dequant_q4_k(src, dst, n / block);
    case DType::q6_k: return dequant_q6_k(src, dst, n / block);
  }
}

void quantize_q8_0(const float* src, std::byte* dst, int64_t n) {
  if (n % 32 != 0) throw std::invalid_argument("quantize_q8_0: n must be a multiple of 32");
  for (int64_t b = 0; b < n / 32; ++b, src += 32, dst += 34) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(src[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = f32_to_f16(d);
    std::memcpy(dst, &dh, 2);
    auto* q = reinterpret_cast<int8_t*>(dst + 2);
    for (int i = 0; i < 32; ++i) q[i] = static_cast<int8_t>(std::lround(src[i] * id));
  }
}

void quantize_q4_0(const float* src, std::byte* dst, int64_t n) {
  if (n % 32 != 0) throw std::invalid_argument("quantize_q4_0: n must be a multiple of 32");
  for (int64_t b = 0; b < n / 32; ++b, src += 32, dst += 18) {
    // The value of largest magnitude maps to -8 so the full 4-bit range is used.
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < 32; ++i) {
      if (std::fabs(src[i]) > amax) {
        amax = std::fabs(src[i]);
        max = src[i];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = f32_to_f16(d);
    std::memcpy(dst, &dh, 2);
    auto* qs = reinterpret_cast<uint8_t*>(dst + 2);
    for (int i = 0; i < 16; ++i) {
      const int lo = std::min(15, static_cast<int>(src[i] * id + 8.5f));
      const int hi = std::min(15, static_cast<int>(src[i + 16] * id + 8.5f));
      qs[i] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

}  // namespace llm::weights
