#include "weights/detokenizer.h"

#include "weights/pretokenize.h"

namespace llm::weights {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(&tokenizer), skip_special_(skip_special) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  if (skip_special_ && tokenizer_->is_special(id)) return {};
  pending_ += tokenizer_->token_bytes(id);
  // Hold back only a tail that can still become a character; anything that
  // can never be valid goes out now as U+FFFD. The held tail starts with a
  // lead byte, so the pieces concatenate to exactly the repair of all bytes.
  const size_t ready = pending_.size() - utf8_incomplete_tail(pending_);
  std::string out = to_valid_utf8(std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out = to_valid_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace llm::weights
