#include "engine/generator.h"

#include "engine/sequence.h"

namespace llm::engine {

Generator::Generator(std::shared_ptr<const Model> model, const weights::Tokenizer& tokenizer, int n_threads,
                     int64_t n_ctx, int64_t max_batch)
    : model_(std::move(model)),
      tokenizer_(&tokenizer),
      cache_(model_->config(), n_ctx > 0 ? n_ctx : model_->config().n_ctx_train),
      ctx_(*model_, n_threads, max_batch) {}

GenerationResult Generator::generate(const GenerationRequest& req, const TokenCallback& on_token,
                                     std::stop_token cancel) {
  const int64_t n_vocab = model_->config().n_vocab;
  validate_request(req, n_vocab, cache_.n_ctx());
  Sequence seq(req, *tokenizer_, n_vocab, cache_.n_ctx());
  cache_.clear();
  // The prompt runs in chunks so a cancellation is noticed during a long prefill too.
  while (seq.prefilling()) {
    if (cancel.stop_requested()) {
      seq.finish(FinishReason::cancelled);
      return seq.result();
    }
    const auto chunk = seq.next_prefill_chunk(ctx_.max_batch());
    if (Status s = model_->forward(chunk, cache_, ctx_); s != Status::ok) throw RequestError(status_message(s));
    seq.prefilled(static_cast<int64_t>(chunk.size()));
  }
  while (!seq.accept_logits(ctx_.logits_row(0), cache_.n_past(), on_token)) {
    if (cancel.stop_requested()) {
      seq.finish(FinishReason::cancelled);
      break;
    }
    const int32_t next = seq.last_token();
    if (model_->forward(std::span<const int32_t>(&next, 1), cache_, ctx_) != Status::ok) {
      seq.finish(FinishReason::length);
      break;
    }
  }
  return seq.result();
}

}  // namespace llm::engine
