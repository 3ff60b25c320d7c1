#pragma once
// Argument handling shared by the engine's command-line tools
// (llm-generate, llm-bench): usage errors exit 2 with the tool's usage text.
#include <cstdio>
#include <cstdlib>
#include <string>

namespace llm::engine::cli {

struct Tool {
  const char* name;
  const char* usage;

  [[noreturn]] void fail(const std::string& msg) const {
    std::fprintf(stderr, "%s: %s\n%s", name, msg.c_str(), usage);
    std::exit(2);
  }

  // The value after argv[i] (a flag), advancing i; a usage error if missing.
  std::string value(int argc, char** argv, int& i) const {
    if (i + 1 >= argc) fail(std::string(argv[i]) + " needs a value");
    return argv[++i];
  }
};

}  // namespace llm::engine::cli
