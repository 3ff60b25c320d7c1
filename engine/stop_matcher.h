#pragma once
// Stop strings that may span tokens: text is held back while it could still
// turn into a stop string, and nothing from a matched stop string on is emitted.
#include <string>
#include <string_view>
#include <vector>

namespace llm::engine {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Adds generated text; returns the part that is now safe to emit.
  std::string push(std::string_view text);
  // End of generation without a match: releases the held text.
  std::string flush();

  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }  // the stop string that ended it

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace llm::engine
