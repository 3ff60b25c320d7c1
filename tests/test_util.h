#pragma once
// Shared helpers for the doctest suites.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace llm::test {

// The shared test models: $LLM_TEST_MODELS, else ../shared/models beside the
// checkout. Missing data fails the test loudly rather than skipping it.
inline std::filesystem::path models_dir() {
  std::filesystem::path dir;
  if (const char* env = std::getenv("LLM_TEST_MODELS"); env != nullptr && *env != '\0') {
    dir = env;
  } else {
    dir = LLM_TEST_MODELS_DIR;
  }
  if (!std::filesystem::is_directory(dir / "stories260K")) {
    throw std::runtime_error("test models not found at '" + dir.string() +
                             "': put the shared models beside the checkout "
                             "(../shared/models) or set LLM_TEST_MODELS");
  }
  return dir;
}

inline std::filesystem::path model_path(const std::string& rel) { return models_dir() / rel; }

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A temporary directory removed at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "llm-test-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::filesystem::path& p, const std::string& data) {
  std::ofstream out(p, std::ios::binary);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!out) throw std::runtime_error("cannot write " + p.string());
}

}  // namespace llm::test
