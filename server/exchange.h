#pragma once
// One HTTP request and its response, as handlers see it. Every method may be
// called from any thread (the engine's included): the session serialises
// them on its strand. Calls after the exchange has ended are ignored.
#include <boost/beast/http.hpp>

#include <functional>
#include <string>

namespace llm::server {

namespace http = boost::beast::http;
using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

class Exchange {
 public:
  virtual ~Exchange() = default;
  // A complete response; ends the exchange.
  virtual void respond(Response res) = 0;
  // 200 text/event-stream; then send_event() per event and end_stream().
  virtual void start_stream() = 0;
  virtual void send_event(std::string sse_event) = 0;  // a whole "data: ...\n\n" event
  virtual void end_stream() = 0;
  // fn runs once if the client goes away before the exchange ends.
  virtual void on_disconnect(std::function<void()> fn) = 0;
  // Token counts for the access log line.
  virtual void set_usage(int64_t prompt_tokens, int64_t completion_tokens) = 0;
};

}  // namespace llm::server
