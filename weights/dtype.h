#pragma once
// Element types of stored tensors and their conversion to f32.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace llm::weights {

enum class DType : uint8_t { f32, f16, bf16, q8_0, q4_0, q4_k, q6_k };

// Values per block and bytes per block. Plain types are blocks of one.
struct DTypeInfo {
  std::string_view name;
  int64_t block_size;
  size_t block_bytes;
};
const DTypeInfo& dtype_info(DType t);
std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);  // "f32", "bf16", "q8_0", ...

// Bytes that n elements (n a multiple of the block size) occupy.
// Returns nullopt when n is not a whole number of blocks.
std::optional<size_t> dtype_bytes(DType t, int64_t n);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint16_t f32_to_bf16(float f);  // round to nearest even; NaN stays NaN
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);   // round to nearest even

// Converts n elements (a whole number of blocks) at src of type t to f32.
void to_f32(DType t, const std::byte* src, float* dst, int64_t n);

// Quantizes n f32 values (multiple of 32) into Q8_0 / Q4_0 blocks (ggml layout).
void quantize_q8_0(const float* src, std::byte* dst, int64_t n);
void quantize_q4_0(const float* src, std::byte* dst, int64_t n);

}  // namespace llm::weights
