#include "clients/sse.h"

namespace llm::clients {

bool SseParser::feed(std::string_view bytes, const Handler& on_event) {
  // Lines end in "\r\n", "\n" or "\r"; a "\r\n" may be split across two chunks.
  size_t pos = 0;
  if (skip_lf_ && !bytes.empty()) {
    skip_lf_ = false;
    if (bytes.front() == '\n') pos = 1;
  }
  while (pos < bytes.size()) {
    const size_t end = bytes.find_first_of("\r\n", pos);
    if (end == std::string_view::npos) {
      line_.append(bytes.substr(pos));
      return true;
    }
    std::string_view line = bytes.substr(pos, end - pos);
    if (!line_.empty()) {  // the line began in an earlier chunk
      line_.append(line);
      line = line_;
    }
    pos = end + 1;
    if (bytes[end] == '\r') {
      if (pos == bytes.size()) skip_lf_ = true;
      else if (bytes[pos] == '\n') ++pos;
    }
    const bool go_on = process_line(line, on_event);
    line_.clear();
    if (!go_on) return false;
  }
  return true;
}

bool SseParser::process_line(std::string_view line, const Handler& on_event) {
  if (line.empty()) {  // a blank line dispatches the event assembled so far
    if (!has_data_) {
      type_.clear();
      return true;
    }
    if (!data_.empty() && data_.back() == '\n') data_.pop_back();
    const SseEvent event{std::move(type_), std::move(data_)};
    type_.clear();
    data_.clear();
    has_data_ = false;
    return on_event(event);
  }
  if (line.front() == ':') return true;  // a comment, e.g. the server's `: ping` keep-alive
  const size_t colon = line.find(':');
  const std::string_view field = line.substr(0, colon);
  std::string_view value = colon == std::string_view::npos ? std::string_view{} : line.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (field == "data") {
    data_.append(value);
    data_.push_back('\n');
    has_data_ = true;
  } else if (field == "event") {
    type_ = value;
  }
  // `id` and `retry` only matter for reconnecting EventSource clients; other fields are ignored by spec.
  return true;
}

}  // namespace llm::clients
