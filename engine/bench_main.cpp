// llm-bench: prefill and decode throughput, like llama-bench.
//   ppN: one forward pass over N prompt tokens from an empty cache.
//   tgN: N decode steps of one token each after a short prompt.
// Each test runs once to warm up, then --reps times; the median is reported.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/cli.h"
#include "engine/kv_cache.h"
#include "engine/model.h"

namespace {

double median(std::vector<double> v);

const char* k_usage =
    "usage: llm-bench (--model PATH | --dummy CONFIG_DIR) [--weight-type f32|bf16|f16] [--threads N]\n"
    "                 [--prompt 128,512] [--gen 64] [--reps 3] [--json]\n"
    "  --dummy builds random weights of the shapes in CONFIG_DIR/config.json.\n";

const llm::engine::cli::Tool k_tool{"llm-bench", k_usage};

[[noreturn]] void usage_error(const std::string& msg) { k_tool.fail(msg); }

std::vector<int64_t> parse_list(const std::string& flag, const std::string& v) {
  std::vector<int64_t> out;
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const long long n = std::stoll(item, &used);
      if (used != item.size() || n <= 0) throw std::invalid_argument(item);
      out.push_back(n);
    } catch (const std::exception&) {
      usage_error(flag + " expects positive numbers separated by commas, got '" + v + "'");
    }
  }
  return out;
}

// Read bandwidth of the whole machine: every pool thread streams its share of
// a buffer far larger than the caches through four independent AVX2 sums.
// Decode is bound by this figure.
double measure_read_gb_per_s(llm::engine::ThreadPool& pool) {
  const size_t n = size_t{1} << 28;  // 1 GiB of floats
  std::vector<float> buf(n, 1.0f);
  std::vector<double> rates;
  std::vector<float> sink(static_cast<size_t>(pool.n_threads()) * 16);
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(static_cast<int64_t>(n / 32), [&](int64_t b, int64_t e) {
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t i = b * 32; i < e * 32; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(buf.data() + i));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(buf.data() + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(buf.data() + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(buf.data() + i + 24));
      }
      float out[8];
      _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
      sink[static_cast<size_t>(b * pool.n_threads() / static_cast<int64_t>(n / 32)) * 16] = out[0];  // keeps the loop
    });
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(static_cast<double>(n * sizeof(float)) / secs / 1e9);
  }
  return median(rates);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace llm;
  using clock = std::chrono::steady_clock;
  spdlog::set_default_logger(spdlog::stderr_color_mt("llm"));
  std::string model_path, dummy_dir, weight_type = "f32";
  int threads = 0, reps = 3;
  std::vector<int64_t> prompts = {128, 512};
  std::vector<int64_t> gens = {64};
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return k_tool.value(argc, argv, i); };
    if (a == "--model" || a == "-m") model_path = value();
    else if (a == "--dummy") dummy_dir = value();
    else if (a == "--weight-type") weight_type = value();
    else if (a == "--threads" || a == "-t") threads = static_cast<int>(parse_list(a, value()).at(0));
    else if (a == "--prompt" || a == "-p") prompts = parse_list(a, value());
    else if (a == "--gen" || a == "-n") gens = parse_list(a, value());
    else if (a == "--reps" || a == "-r") reps = static_cast<int>(parse_list(a, value()).at(0));
    else if (a == "--json") json = true;
    else if (a == "--help" || a == "-h") { std::fputs(k_usage, stdout); return 0; }
    else usage_error("unknown argument '" + a + "'");
  }
  if (model_path.empty() == dummy_dir.empty()) usage_error("give exactly one of --model and --dummy");

  try {
    std::shared_ptr<const engine::Model> model;
    std::string name;
    if (!dummy_dir.empty()) {
      const auto dtype = weights::dtype_from_name(weight_type);
      if (!dtype) usage_error("unknown --weight-type '" + weight_type + "'");
      const auto config = weights::ModelConfig::from_hf_file(std::filesystem::path(dummy_dir) / "config.json");
      model = std::make_shared<const engine::Model>(
          std::make_unique<weights::Checkpoint>(weights::Checkpoint::dummy(config, *dtype)));
      name = std::filesystem::path(dummy_dir).filename().string() + " (dummy)";
    } else {
      model = engine::Model::load(model_path);
      name = model->checkpoint().default_name();
      weight_type = model->stored_weight_type();
    }
    const weights::ModelConfig& c = model->config();
    const int64_t max_prompt = *std::max_element(prompts.begin(), prompts.end());
    const int64_t max_gen = *std::max_element(gens.begin(), gens.end());
    engine::ForwardContext ctx(*model, threads, std::max<int64_t>(max_prompt, 1));
    engine::KvCache cache(c, std::max(max_prompt, max_gen + 1) + 1);
    std::mt19937 rng(42);
    std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(c.n_vocab - 1));

    auto report = [&](const std::string& test, int64_t n, const std::vector<double>& secs) {
      std::vector<double> rates;
      for (double s : secs) rates.push_back(static_cast<double>(n) / s);
      const double med = median(rates);
      if (json) {
        std::printf("{\"test\":\"%s\",\"model\":\"%s\",\"n_tokens\":%lld,\"threads\":%d,\"weight_type\":\"%s\","
                    "\"reps\":%d,\"tokens_per_s\":%.2f,\"min_tokens_per_s\":%.2f,\"max_tokens_per_s\":%.2f}\n",
                    test.c_str(), name.c_str(), static_cast<long long>(n), ctx.n_threads(), weight_type.c_str(), reps,
                    med, *std::min_element(rates.begin(), rates.end()), *std::max_element(rates.begin(), rates.end()));
      } else {
        std::printf("%-28s %-8s %-6s threads %d  %10.2f tok/s (median of %d)\n", name.c_str(), test.c_str(),
                    weight_type.c_str(), ctx.n_threads(), med, reps);
      }
      std::fflush(stdout);
    };

    // Memory bandwidth, and the decode bound it implies for these weights.
    const double gb_per_s = measure_read_gb_per_s(ctx.pool());
    const double bound = gb_per_s * 1e9 / static_cast<double>(model->weight_bytes());
    if (json) {
      std::printf("{\"test\":\"mem_read\",\"threads\":%d,\"gb_per_s\":%.2f,\"weight_bytes\":%zu,"
                  "\"decode_bound_tokens_per_s\":%.2f}\n",
                  ctx.n_threads(), gb_per_s, model->weight_bytes(), bound);
    } else {
      std::printf("memory read %.1f GB/s over %d threads; %.0f MiB of weights per token: decode bound %.2f tok/s\n",
                  gb_per_s, ctx.n_threads(), static_cast<double>(model->weight_bytes()) / (1 << 20), bound);
    }

    for (int64_t n : prompts) {
      std::vector<int32_t> tokens(static_cast<size_t>(n));
      std::vector<double> secs;
      for (int r = -1; r < reps; ++r) {  // r == -1: warm-up
        for (int32_t& t : tokens) t = token(rng);
        cache.clear();
        const auto t0 = clock::now();
        if (model->forward(tokens, cache, ctx) != engine::Status::ok) throw std::runtime_error("forward failed");
        const double s = std::chrono::duration<double>(clock::now() - t0).count();
        if (r >= 0) secs.push_back(s);
      }
      report("pp" + std::to_string(n), n, secs);
    }
    for (int64_t n : gens) {
      std::vector<double> secs;
      for (int r = -1; r < reps; ++r) {
        cache.clear();
        int32_t next = token(rng);
        if (model->forward(std::span<const int32_t>(&next, 1), cache, ctx) != engine::Status::ok) {
          throw std::runtime_error("forward failed");
        }
        const auto t0 = clock::now();
        for (int64_t i = 0; i < n; ++i) {
          const auto logits = ctx.logits_row(0);
          next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
          if (model->forward(std::span<const int32_t>(&next, 1), cache, ctx) != engine::Status::ok) {
            throw std::runtime_error("forward failed");
          }
        }
        const double s = std::chrono::duration<double>(clock::now() - t0).count();
        if (r >= 0) secs.push_back(s);
      }
      report("tg" + std::to_string(n), n, secs);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llm-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
