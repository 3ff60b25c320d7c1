#include "server/config.h"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace llm::server {

namespace {

const char* k_usage =
    "usage: llm-server --model PATH [options]\n"
    "  --model PATH                  Hugging Face model directory or .gguf file\n"
    "  --host ADDR                   listen address (default 127.0.0.1)\n"
    "  --port N                      listen port (default 8080; 0 picks a free one)\n"
    "  --ctx N                       context length per sequence (default min(model, 4096))\n"
    "  --parallel N                  sequences generated at a time (default 4)\n"
    "  --threads N                   compute threads (default: all cores)\n"
    "  --api-key KEY                 require 'Authorization: Bearer KEY' (also env LLM_API_KEY)\n"
    "  --model-alias NAME            model name reported and accepted by the API\n"
    "  --max-queue N                 requests waiting for a slot before 429 (default 64)\n"
    "  --cors-origin ORIGIN          allow browser requests from ORIGIN ('*' for any)\n"
    "  --log-format text|json        log lines as text or JSON objects (default text)\n"
    "  --max-body-bytes N            largest request body accepted (default 4 MiB)\n"
    "  --timeout-seconds N           request read and keep-alive idle timeout (default 60)\n"
    "  --shutdown-timeout-seconds N  on SIGINT/SIGTERM, time running requests get to finish (default 10)\n"
    "  --prefill-chunk N             prompt tokens per scheduler step (default 256)\n";

int64_t to_int(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  size_t used = 0;
  long long n = 0;
  try {
    n = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size() || n < lo || n > hi) {
    throw std::invalid_argument(flag + " expects an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                "], got '" + v + "'");
  }
  return n;
}

}  // namespace

std::optional<ServerConfig> parse_args(int argc, char** argv, int& exit_code) {
  ServerConfig c;
  if (const char* key = std::getenv("LLM_API_KEY"); key != nullptr) c.api_key = key;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
        return argv[++i];
      };
      if (a == "--help" || a == "-h") {
        std::fputs(k_usage, stdout);
        exit_code = 0;
        return std::nullopt;
      } else if (a == "--model" || a == "-m") {
        c.model_path = value();
      } else if (a == "--host") {
        c.host = value();
      } else if (a == "--port") {
        c.port = static_cast<uint16_t>(to_int(a, value(), 0, 65535));
      } else if (a == "--ctx") {
        c.ctx = to_int(a, value(), 0, int64_t{1} << 24);
      } else if (a == "--parallel") {
        c.parallel = static_cast<int>(to_int(a, value(), 1, 256));
      } else if (a == "--threads") {
        c.threads = static_cast<int>(to_int(a, value(), 0, 1024));
      } else if (a == "--api-key") {
        c.api_key = value();
      } else if (a == "--model-alias") {
        c.model_alias = value();
      } else if (a == "--max-queue") {
        c.max_queue = to_int(a, value(), 0, 1 << 20);
      } else if (a == "--cors-origin") {
        c.cors_origin = value();
      } else if (a == "--log-format") {
        c.log_format = value();
        if (c.log_format != "text" && c.log_format != "json") {
          throw std::invalid_argument("--log-format must be text or json");
        }
      } else if (a == "--max-body-bytes") {
        c.max_body_bytes = static_cast<size_t>(to_int(a, value(), 64, int64_t{1} << 30));
      } else if (a == "--timeout-seconds") {
        c.timeout_seconds = static_cast<int>(to_int(a, value(), 1, 86400));
      } else if (a == "--shutdown-timeout-seconds") {
        c.shutdown_timeout_seconds = static_cast<int>(to_int(a, value(), 0, 3600));
      } else if (a == "--prefill-chunk") {
        c.prefill_chunk = to_int(a, value(), 1, 8192);
      } else {
        throw std::invalid_argument("unknown argument '" + a + "'");
      }
    }
    if (c.model_path.empty()) throw std::invalid_argument("--model is required");
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "llm-server: %s\n%s", e.what(), k_usage);
    exit_code = 2;
    return std::nullopt;
  }
  return c;
}

}  // namespace llm::server
