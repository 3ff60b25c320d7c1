#include "weights/huge_buffer.h"

#include <sys/mman.h>

#include <new>
#include <utility>

namespace llm::weights {

namespace {
constexpr size_t k_huge_page = size_t{2} << 20;
}

HugeBuffer::HugeBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  // Small buffers gain nothing from huge pages; round big ones up to whole pages.
  mapped_ = bytes >= k_huge_page ? (bytes + k_huge_page - 1) / k_huge_page * k_huge_page : bytes;
  void* p = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  if (mapped_ >= k_huge_page) ::madvise(p, mapped_, MADV_HUGEPAGE);  // advisory: failure is harmless
  data_ = static_cast<std::byte*>(p);
}

HugeBuffer::~HugeBuffer() {
  if (data_ != nullptr) ::munmap(data_, mapped_);
}

HugeBuffer::HugeBuffer(HugeBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), mapped_(std::exchange(o.mapped_, 0)) {}

HugeBuffer& HugeBuffer::operator=(HugeBuffer&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) ::munmap(data_, mapped_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
  }
  return *this;
}

}  // namespace llm::weights
