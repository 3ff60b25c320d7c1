#pragma once
// Streaming detokenizer: turns generated token ids into text pieces that are
// always whole UTF-8 characters, even when one character spans several tokens.
#include <cstdint>
#include <string>

#include "weights/tokenizer.h"

namespace llm::weights {

class IncrementalDetokenizer {
 public:
  // skip_special: control tokens (e.g. <|im_end|>) produce no text.
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special = true);
  // Adds one token; returns the text that is complete and safe to show now
  // (possibly empty while a multi-byte character is still incomplete).
  std::string push(int32_t id);
  // End of stream: whatever is still held, with invalid bytes as U+FFFD.
  std::string flush();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes of an incomplete UTF-8 sequence
};

}  // namespace llm::weights
