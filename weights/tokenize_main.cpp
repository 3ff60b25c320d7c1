// llm-tokenize: prints the token ids of a text, as the server would encode it.

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "weights/gguf.h"
#include "weights/pretokenize.h"
#include "weights/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using llm::weights::Tokenizer;

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

constexpr std::string_view kUsage =
    "usage: llm-tokenize --model PATH [--no-special] [--add-bos] [--json] [--] TEXT\n"
    "\n"
    "  --model PATH   a Hugging Face model directory (tokenizer.json) or a .gguf file\n"
    "  --no-special   treat special tokens such as <|im_start|> as plain text\n"
    "  --add-bos      prepend BOS when the model uses one\n"
    "  --json         print {\"ids\": [...], \"pieces\": [...]}\n"
    "  TEXT           the text to tokenize; - reads standard input\n";

struct Options {
  fs::path model;
  std::string text;
  bool parse_special = true;
  bool add_bos = false;
  bool json = false;
};

struct UsageError {
  std::string message;
};

Options parse_args(int argc, char** argv) {
  Options opt;
  std::optional<std::string> text;
  bool have_model = false;
  bool options_done = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (!options_done && arg == "--") {
      options_done = true;
    } else if (!options_done && arg == "--model") {
      if (i + 1 >= argc) throw UsageError{"--model needs a path"};
      opt.model = argv[++i];
      have_model = true;
    } else if (!options_done && arg == "--no-special") {
      opt.parse_special = false;
    } else if (!options_done && arg == "--add-bos") {
      opt.add_bos = true;
    } else if (!options_done && arg == "--json") {
      opt.json = true;
    } else if (!options_done && arg.size() > 1 && arg.starts_with("-")) {
      throw UsageError{"unknown option " + std::string(arg)};
    } else if (text) {
      throw UsageError{"more than one TEXT argument (quote the text)"};
    } else {
      text = std::string(arg);
    }
  }
  if (!have_model) throw UsageError{"--model is required"};
  if (!text) throw UsageError{"TEXT is required"};
  if (*text == "-") {
    text = std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    if (std::cin.bad()) throw std::runtime_error("cannot read standard input");
  }
  opt.text = std::move(*text);
  return opt;
}

Tokenizer load_tokenizer(const fs::path& path) {
  if (fs::is_directory(path)) return Tokenizer::from_hf_dir(path);
  if (!fs::exists(path)) throw std::runtime_error(path.string() + ": no such file or directory");
  const llm::weights::GgufFile gguf(path);
  return Tokenizer::from_gguf(gguf);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    }
  }
  // Warnings (e.g. an unknown pre-tokenizer) go to stderr, never among the ids.
  spdlog::set_default_logger(spdlog::stderr_color_mt("llm-tokenize"));

  try {
    const Options opt = parse_args(argc, argv);
    const Tokenizer tokenizer = load_tokenizer(opt.model);
    const std::vector<int32_t> ids = tokenizer.encode(opt.text, opt.add_bos, opt.parse_special);
    if (opt.json) {
      nlohmann::json pieces = nlohmann::json::array();
      for (int32_t id : ids) pieces.push_back(llm::weights::to_valid_utf8(tokenizer.token_bytes(id)));
      const nlohmann::json out = {{"ids", ids}, {"pieces", pieces}};
      std::cout << out.dump() << '\n';
    } else {
      std::string line;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i > 0) line += ' ';
        line += std::to_string(ids[i]);
      }
      std::cout << line << '\n';
    }
    std::cout.flush();
    if (!std::cout) {
      std::cerr << "llm-tokenize: cannot write the output\n";
      return kExitError;
    }
    return 0;
  } catch (const UsageError& e) {
    std::cerr << "llm-tokenize: " << e.message << "\n\n" << kUsage;
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "llm-tokenize: " << e.what() << '\n';
    return kExitError;
  }
}
