#include "engine/sequence.h"

#include <algorithm>

namespace llm::engine {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
  }
  return "unknown";
}

void validate_request(const GenerationRequest& req, int64_t n_vocab, int64_t n_ctx) {
  const auto n_prompt = static_cast<int64_t>(req.prompt.size());
  if (n_prompt == 0) throw RequestError("the prompt is empty");
  for (int32_t id : req.prompt) {
    if (id < 0 || id >= n_vocab) throw RequestError("prompt token " + std::to_string(id) + " is outside the vocabulary");
  }
  if (n_prompt >= n_ctx) {
    throw RequestError("the prompt has " + std::to_string(n_prompt) + " tokens but the context holds " +
                       std::to_string(n_ctx) + " (prompt plus at least one generated token)");
  }
  if (req.max_tokens < 0) throw RequestError("max_tokens must be positive");
  if (req.max_tokens > 0 && n_prompt + req.max_tokens > n_ctx) {
    throw RequestError("the context holds " + std::to_string(n_ctx) + " tokens but " +
                       std::to_string(n_prompt + req.max_tokens) + " were requested (" + std::to_string(n_prompt) +
                       " in the prompt, " + std::to_string(req.max_tokens) + " to generate)");
  }
  for (int32_t id : req.stop_token_ids) {
    if (id < 0 || id >= n_vocab) throw RequestError("stop token " + std::to_string(id) + " is outside the vocabulary");
  }
  if (std::string err = validate(req.sampling, static_cast<int32_t>(n_vocab)); !err.empty()) throw RequestError(err);
}

Sequence::Sequence(GenerationRequest req, const weights::Tokenizer& tokenizer, int64_t n_vocab, int64_t n_ctx)
    : req_(std::move(req)),
      tokenizer_(&tokenizer),
      n_ctx_(n_ctx),
      max_new_(req_.max_tokens > 0 ? req_.max_tokens : n_ctx - static_cast<int64_t>(req_.prompt.size())),
      sampler_(req_.sampling, static_cast<int32_t>(n_vocab)),
      detok_(tokenizer),
      stops_(req_.stop),
      t_start_(std::chrono::steady_clock::now()) {
  sampler_.add_prompt(req_.prompt);
  result_.n_prompt_tokens = static_cast<int32_t>(req_.prompt.size());
}

std::span<const int32_t> Sequence::next_prefill_chunk(int64_t max) const {
  const int64_t n = std::min<int64_t>(max, static_cast<int64_t>(req_.prompt.size()) - n_prefilled_);
  return std::span<const int32_t>(req_.prompt).subspan(static_cast<size_t>(n_prefilled_), static_cast<size_t>(n));
}

void Sequence::prefilled(int64_t n) { n_prefilled_ += n; }

void Sequence::emit(TokenEvent& ev, std::string text, const TokenCallback& on_token) {
  ev.text = std::move(text);
  result_.text += ev.text;
  if (on_token) on_token(ev);
}

void Sequence::mark_time_done() {
  const auto now = std::chrono::steady_clock::now();
  if (result_.n_generated_tokens == 0) t_first_ = now;
  result_.prefill_seconds = std::chrono::duration<double>(t_first_ - t_start_).count();
  result_.decode_seconds = std::chrono::duration<double>(now - t_first_).count();
}

void Sequence::finish(FinishReason reason) {
  if (finished_) return;
  finished_ = true;
  result_.finish = reason;
  mark_time_done();
}

bool Sequence::accept_logits(std::span<const float> logits, int64_t n_past, const TokenCallback& on_token) {
  logits_.assign(logits.begin(), logits.end());
  const Sampled s = sampler_.sample(logits_);
  if (result_.n_generated_tokens == 0) t_first_ = std::chrono::steady_clock::now();
  result_.tokens.push_back(s.id);
  ++result_.n_generated_tokens;
  sampler_.add_generated(s.id);

  const bool is_end =
      (!req_.ignore_eos && tokenizer_->is_eog(s.id)) ||
      std::find(req_.stop_token_ids.begin(), req_.stop_token_ids.end(), s.id) != req_.stop_token_ids.end();
  if (is_end) {
    std::string tail = stops_.push(detok_.flush());
    tail += stops_.flush();
    if (!tail.empty()) {
      TokenEvent ev;  // id -1: held-back text released at the end
      emit(ev, std::move(tail), on_token);
    }
    finish(FinishReason::stop);
    return true;
  }
  TokenEvent ev;
  ev.id = s.id;
  ev.logprob = s.logprob;
  ev.top_logprobs = s.top;
  std::string text = stops_.push(detok_.push(s.id));
  if (stops_.stopped()) {
    emit(ev, std::move(text), on_token);
    finish(FinishReason::stop);
    return true;
  }
  // The next forward pass needs one more cache position.
  if (result_.n_generated_tokens >= max_new_ || n_past >= n_ctx_) {
    text += stops_.push(detok_.flush());
    text += stops_.flush();
    emit(ev, std::move(text), on_token);
    finish(FinishReason::length);
    return true;
  }
  emit(ev, std::move(text), on_token);
  return false;
}

}  // namespace llm::engine
