#pragma once
// Read-only memory map of a whole file. Model files are multi-GB: they are
// never copied into memory to be parsed, only mapped and viewed.
#include <cstddef>
#include <filesystem>
#include <span>

namespace llm::weights {

class MappedFile {
 public:
  // Throws std::runtime_error naming the file if it cannot be opened or mapped.
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::filesystem::path& path() const { return path_; }

 private:
  void release() noexcept;
  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace llm::weights
