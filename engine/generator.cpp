#include "engine/generator.h"

#include <algorithm>
#include <chrono>
#include <span>

#include "engine/stop_matcher.h"
#include "weights/detokenizer.h"

namespace llm::engine {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
  }
  return "unknown";
}

Generator::Generator(std::shared_ptr<const Model> model, const weights::Tokenizer& tokenizer, int n_threads,
                     int64_t n_ctx, int64_t max_batch)
    : model_(std::move(model)),
      tokenizer_(&tokenizer),
      cache_(model_->config(), n_ctx > 0 ? n_ctx : model_->config().n_ctx_train),
      ctx_(*model_, n_threads, max_batch) {}

GenerationResult Generator::generate(const GenerationRequest& req, const TokenCallback& on_token,
                                     std::stop_token cancel) {
  using clock = std::chrono::steady_clock;
  const weights::ModelConfig& c = model_->config();
  const auto n_prompt = static_cast<int64_t>(req.prompt.size());
  if (n_prompt == 0) throw RequestError("the prompt is empty");
  for (int32_t id : req.prompt) {
    if (id < 0 || id >= c.n_vocab) throw RequestError("prompt token " + std::to_string(id) + " is outside the vocabulary");
  }
  if (n_prompt >= cache_.n_ctx()) {
    throw RequestError("the prompt has " + std::to_string(n_prompt) + " tokens but the context holds " +
                       std::to_string(cache_.n_ctx()) + " (prompt plus at least one generated token)");
  }
  if (req.max_tokens < 0) throw RequestError("max_tokens must be positive");
  if (req.max_tokens > 0 && n_prompt + req.max_tokens > cache_.n_ctx()) {
    throw RequestError("the context holds " + std::to_string(cache_.n_ctx()) + " tokens but " +
                       std::to_string(n_prompt + req.max_tokens) + " were requested (" + std::to_string(n_prompt) +
                       " in the prompt, " + std::to_string(req.max_tokens) + " to generate)");
  }
  if (std::string err = validate(req.sampling, static_cast<int32_t>(c.n_vocab)); !err.empty()) throw RequestError(err);
  const int64_t max_new = req.max_tokens > 0 ? req.max_tokens : cache_.n_ctx() - n_prompt;

  GenerationResult result;
  result.n_prompt_tokens = static_cast<int32_t>(n_prompt);
  const auto t_start = clock::now();

  // Start from scratch each request; a prompt is evaluated in chunks so a
  // cancellation is noticed during a long prefill too.
  cache_.clear();
  std::span<const int32_t> prompt(req.prompt);
  for (int64_t start = 0; start < n_prompt; start += ctx_.max_batch()) {
    if (cancel.stop_requested()) {
      result.finish = FinishReason::cancelled;
      return result;
    }
    const int64_t len = std::min(ctx_.max_batch(), n_prompt - start);
    const Status s = model_->forward(prompt.subspan(static_cast<size_t>(start), static_cast<size_t>(len)), cache_, ctx_);
    if (s != Status::ok) throw RequestError(status_message(s));
  }

  Sampler sampler(req.sampling, static_cast<int32_t>(c.n_vocab));
  sampler.add_prompt(req.prompt);
  weights::IncrementalDetokenizer detok(*tokenizer_);
  StopMatcher stops(req.stop);
  auto t_first = clock::now();

  auto emit = [&](TokenEvent& ev, std::string text) {
    ev.text = std::move(text);
    result.text += ev.text;
    if (on_token) on_token(ev);
  };

  for (int64_t i = 0;; ++i) {
    const std::span<const float> row = ctx_.logits_row(0);
    logits_.assign(row.begin(), row.end());
    const Sampled s = sampler.sample(logits_);
    if (i == 0) t_first = clock::now();
    result.tokens.push_back(s.id);
    ++result.n_generated_tokens;
    sampler.add_generated(s.id);

    const bool is_end = (!req.ignore_eos && tokenizer_->is_eog(s.id)) ||
                        std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(), s.id) != req.stop_token_ids.end();
    if (is_end) {
      result.finish = FinishReason::stop;
      std::string tail = stops.push(detok.flush());
      tail += stops.flush();
      if (!tail.empty()) {
        TokenEvent ev;  // id -1: text held back until now, no token of its own
        emit(ev, std::move(tail));
      }
      break;
    }
    TokenEvent ev;
    ev.id = s.id;
    ev.logprob = s.logprob;
    ev.top_logprobs = s.top;
    std::string text = stops.push(detok.push(s.id));
    if (stops.stopped()) {
      result.finish = FinishReason::stop;
      emit(ev, std::move(text));
      break;
    }
    const bool at_limit = result.n_generated_tokens >= max_new || cache_.n_past() >= cache_.n_ctx();
    if (at_limit) {
      text += stops.push(detok.flush());
      text += stops.flush();
      result.finish = FinishReason::length;
      emit(ev, std::move(text));
      break;
    }
    emit(ev, std::move(text));
    if (cancel.stop_requested()) {
      result.finish = FinishReason::cancelled;
      break;
    }
    const int32_t next = s.id;
    const Status st = model_->forward(std::span<const int32_t>(&next, 1), cache_, ctx_);
    if (st != Status::ok) {
      result.finish = FinishReason::length;
      break;
    }
  }
  const auto t_end = clock::now();
  result.prefill_seconds = std::chrono::duration<double>(t_first - t_start).count();
  result.decode_seconds = std::chrono::duration<double>(t_end - t_first).count();
  return result;
}

}  // namespace llm::engine
