#pragma once
// Anonymous memory for large weight buffers, backed by transparent huge pages
// where the kernel allows it (THP "madvise" mode is common): streaming 2 GB of
// weights per token through 4 KiB pages costs a TLB walk every 4 KiB.
#include <cstddef>

namespace llm::weights {

class HugeBuffer {
 public:
  HugeBuffer() = default;
  explicit HugeBuffer(size_t bytes);  // throws std::bad_alloc
  ~HugeBuffer();
  HugeBuffer(HugeBuffer&& other) noexcept;
  HugeBuffer& operator=(HugeBuffer&& other) noexcept;
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  template <typename T>
  T* as() const { return reinterpret_cast<T*>(data_); }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;
};

}  // namespace llm::weights
