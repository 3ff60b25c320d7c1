#pragma once
// Incremental parser for `text/event-stream` (the WHATWG server-sent events format), the framing of
// streamed OpenAI responses. Network reads split the stream anywhere, so it is fed arbitrary chunks
// and emits an event only once the blank line that ends it has arrived.
#include <functional>
#include <string>
#include <string_view>

namespace llm::clients {

struct SseEvent {
  std::string type;  // the `event:` field; empty when absent (the spec's "message")
  std::string data;  // the `data:` lines joined with '\n'
};

class SseParser {
 public:
  // Returns false to stop parsing (e.g. after `data: [DONE]`).
  using Handler = std::function<bool(const SseEvent&)>;

  // Parses `bytes` and calls `on_event` for each event it completes. Returns false once a handler
  // returned false; the rest of `bytes` is then left unparsed.
  bool feed(std::string_view bytes, const Handler& on_event);

 private:
  bool process_line(std::string_view line, const Handler& on_event);

  std::string line_;             // a line not yet terminated, carried across chunks
  bool skip_lf_ = false;         // the last chunk ended in '\r': a following '\n' belongs to it
  std::string data_;             // data of the event being assembled
  std::string type_;
  bool has_data_ = false;        // a `data` field was seen (an empty `data:` still makes an event)
};

}  // namespace llm::clients
