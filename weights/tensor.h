#pragma once
// A view of one stored tensor inside a mapped file.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "weights/dtype.h"

namespace llm::weights {

struct TensorView {
  std::string name;
  DType dtype = DType::f32;
  // Outermost dimension first (PyTorch order): a Linear weight [out, in] is {out, in}.
  // GGUF lists dims innermost first; its reader reverses them into this order.
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  size_t n_bytes = 0;

  int64_t n_elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  // Row length (innermost dim) and row count, for matrices and vectors alike.
  int64_t n_cols() const { return shape.empty() ? 1 : shape.back(); }
  int64_t n_rows() const { return shape.empty() ? 1 : n_elements() / shape.back(); }

  std::vector<float> to_f32() const {
    std::vector<float> out(static_cast<size_t>(n_elements()));
    weights::to_f32(dtype, data, out.data(), n_elements());
    return out;
  }
};

std::string shape_string(const std::vector<int64_t>& shape);  // "[896, 151936]"

}  // namespace llm::weights
