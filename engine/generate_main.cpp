// llm-generate: streams a completion of a prompt to stdout.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "engine/cli.h"
#include "engine/generator.h"
#include "weights/chat_template.h"

namespace {

const char* k_usage =
    "usage: llm-generate --model PATH --prompt TEXT [-n N] [--temp T] [--top-k K] [--top-p P]\n"
    "                    [--min-p P] [--seed S] [--ctx N] [--threads N] [--chat] [--ids] [--stop TEXT]\n"
    "  Streams the generated text (not the prompt) to stdout; logs and timings go to stderr.\n"
    "  --chat  wraps the prompt as a user message with the model's chat template\n"
    "  --ids   prints the generated token ids instead of text\n";

const llm::engine::cli::Tool k_tool{"llm-generate", k_usage};

[[noreturn]] void usage_error(const std::string& msg) { k_tool.fail(msg); }

template <typename T>
T parse_number(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    T out;
    if constexpr (std::is_same_v<T, float>) out = std::stof(v, &used);
    else if constexpr (std::is_same_v<T, uint64_t>) out = std::stoull(v, &used);
    else out = static_cast<T>(std::stoll(v, &used));
    if (used != v.size()) throw std::invalid_argument(v);
    return out;
  } catch (const std::exception&) {
    usage_error(flag + " expects a number, got '" + v + "'");
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace llm;
  spdlog::set_default_logger(spdlog::stderr_color_mt("llm"));
  std::string model_path, prompt;
  bool have_prompt = false, chat = false, ids = false;
  int threads = 0;
  int64_t ctx = 0;
  engine::GenerationRequest req;
  req.max_tokens = 128;
  req.sampling.temperature = 0.8f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return k_tool.value(argc, argv, i); };
    if (a == "--model" || a == "-m") model_path = value();
    else if (a == "--prompt" || a == "-p") { prompt = value(); have_prompt = true; }
    else if (a == "-n" || a == "--max-tokens") req.max_tokens = parse_number<int32_t>(a, value());
    else if (a == "--temp") req.sampling.temperature = parse_number<float>(a, value());
    else if (a == "--top-k") req.sampling.top_k = parse_number<int32_t>(a, value());
    else if (a == "--top-p") req.sampling.top_p = parse_number<float>(a, value());
    else if (a == "--min-p") req.sampling.min_p = parse_number<float>(a, value());
    else if (a == "--seed") req.sampling.seed = parse_number<uint64_t>(a, value());
    else if (a == "--ctx") ctx = parse_number<int64_t>(a, value());
    else if (a == "--threads" || a == "-t") threads = parse_number<int>(a, value());
    else if (a == "--stop") req.stop.push_back(value());
    else if (a == "--chat") chat = true;
    else if (a == "--ids") ids = true;
    else if (a == "--help" || a == "-h") { std::fputs(k_usage, stdout); return 0; }
    else usage_error("unknown argument '" + a + "'");
  }
  if (model_path.empty()) usage_error("--model is required");
  if (!have_prompt) usage_error("--prompt is required");
  if (req.max_tokens <= 0) usage_error("-n must be positive");

  try {
    auto model = engine::Model::load(model_path);
    const weights::Tokenizer tokenizer = model->checkpoint().load_tokenizer();
    std::string text = prompt;
    bool add_bos = true;
    if (chat) {
      const weights::ChatTemplate tmpl = model->checkpoint().load_chat_template(tokenizer);
      text = tmpl.render(std::vector<weights::ChatMessage>{{"user", prompt}}, true);
      add_bos = false;  // templates write their own BOS where the model wants one
    }
    req.prompt = tokenizer.encode(text, add_bos && tokenizer.add_bos(), /*parse_special=*/chat);
    if (ctx == 0) ctx = std::min<int64_t>(model->config().n_ctx_train, 4096);
    engine::Generator gen(model, tokenizer, threads, ctx);
    spdlog::info("prompt: {} tokens, context {}", req.prompt.size(), gen.n_ctx());
    bool first = true;
    const engine::GenerationResult r = gen.generate(req, [&](const engine::TokenEvent& ev) {
      if (ids) {
        if (ev.id < 0) return;
        std::printf(first ? "%d" : " %d", ev.id);
        first = false;
      } else {
        std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
      }
      std::fflush(stdout);
    });
    std::fputc('\n', stdout);
    spdlog::info("finish: {}; prompt {} tokens in {:.3f} s ({:.1f} tok/s); generated {} tokens in {:.3f} s ({:.1f} tok/s)",
                 engine::finish_reason_name(r.finish), r.n_prompt_tokens, r.prefill_seconds,
                 r.n_prompt_tokens / std::max(r.prefill_seconds, 1e-9), r.n_generated_tokens, r.decode_seconds,
                 (r.n_generated_tokens - 1) / std::max(r.decode_seconds, 1e-9));
  } catch (const engine::RequestError& e) {
    std::fprintf(stderr, "llm-generate: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llm-generate: %s\n", e.what());
    return 1;
  }
  return 0;
}
