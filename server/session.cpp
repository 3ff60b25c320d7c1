#include "server/session.h"

#include <spdlog/spdlog.h>

#include <sstream>

#include "server/api_error.h"
#include "server/router.h"

namespace llm::server {

namespace net = boost::asio;
namespace beast = boost::beast;

namespace {

constexpr size_t k_header_limit = 16 * 1024;
// A client that stops reading while tokens keep coming is dropped rather
// than buffered without bound.
constexpr size_t k_max_queued_bytes = 8u << 20;
// Pipelined bytes held while a response is pending; beyond this we stop reading.
constexpr size_t k_max_pipelined_bytes = 64 * 1024;
constexpr auto k_ping_interval = std::chrono::seconds(5);

std::string chunk(const std::string& data) {
  std::ostringstream os;
  os << std::hex << data.size() << "\r\n" << data << "\r\n";
  return os.str();
}

}  // namespace

Session::Session(net::ip::tcp::socket socket, std::shared_ptr<AppState> state, const Router& router)
    : stream_(std::move(socket)), state_(std::move(state)), router_(router), ping_timer_(stream_.get_executor()) {}

void Session::start() {
  net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->do_read(); });
}

void Session::do_read() {
  if (closed_) return;
  if (state_->shutting_down) return close();
  parser_.emplace();
  parser_->header_limit(k_header_limit);
  parser_->body_limit(state_->config.max_body_bytes);
  // The whole request (headers and body) must arrive within the timeout: a
  // slow-loris client is cut off, and so is an idle keep-alive connection.
  stream_.expires_after(std::chrono::seconds(state_->config.timeout_seconds));
  http::async_read_header(stream_, buffer_, *parser_,
                          beast::bind_front_handler(&Session::on_header, shared_from_this()));
}

void Session::on_header(beast::error_code ec, size_t bytes) {
  if (ec) return on_read(ec, bytes);  // includes a declared body over the limit (413)
  const auto expect = parser_->get().find(http::field::expect);
  if (expect == parser_->get().end() || !beast::iequals(expect->value(), "100-continue")) return read_body();
  // The client waits for this before sending its body (curl does for large
  // ones, for a second if nobody answers).
  static const std::string k_continue = "HTTP/1.1 100 Continue\r\n\r\n";
  net::async_write(stream_, net::buffer(k_continue), [self = shared_from_this()](beast::error_code ec, size_t) {
    if (ec) return self->close();
    self->read_body();
  });
}

void Session::read_body() {
  http::async_read(stream_, buffer_, *parser_, beast::bind_front_handler(&Session::on_read, shared_from_this()));
}

void Session::on_read(beast::error_code ec, size_t) {
  if (ec == http::error::body_limit) {
    keep_alive_ = false;
    return reply_error(413, "invalid_request_error",
                       "the request body exceeds " + std::to_string(state_->config.max_body_bytes) + " bytes", true);
  }
  if (ec == http::error::header_limit) {
    return reply_error(431, "invalid_request_error", "the request headers are too large", true);
  }
  if (ec == http::error::bad_method || ec == http::error::bad_target || ec == http::error::bad_version ||
      ec == http::error::bad_field || ec == http::error::bad_value || ec == http::error::bad_content_length ||
      ec == http::error::bad_transfer_encoding || ec == http::error::bad_chunk || ec == http::error::bad_line_ending) {
    return reply_error(400, "invalid_request_error", "malformed HTTP request: " + ec.message(), true);
  }
  if (ec) return close();  // end of stream, timeout, reset
  handle(parser_->release());
}

void Session::reply_error(int status, const std::string& type, const std::string& message, bool close_after) {
  // A request that could not even be parsed still gets an exchange of its own.
  ++exchange_no_;
  in_exchange_ = true;
  ending_ = false;
  streaming_ = false;
  method_ = "-";
  target_ = "-";
  started_ = std::chrono::steady_clock::now();
  close_after_ = close_after;
  ++state_->n_open_exchanges;
  Response res{static_cast<http::status>(status), 11};
  res.set(http::field::content_type, "application/json");
  res.body() = ApiError(status, type, message).to_json();
  respond(exchange_no_, std::move(res));
}

void Session::handle(Request req) {
  ++exchange_no_;
  in_exchange_ = true;
  ending_ = false;
  streaming_ = false;
  close_after_ = false;
  keep_alive_ = req.keep_alive();
  on_disconnect_ = nullptr;
  method_ = std::string(req.method_string());
  target_ = std::string(req.target());
  status_ = 0;
  prompt_tokens_ = completion_tokens_ = -1;
  started_ = std::chrono::steady_clock::now();
  ++state_->n_open_exchanges;
  router_.dispatch(*state_, req, std::make_shared<SessionExchange>(shared_from_this(), exchange_no_));
  // Still pending (generation under way): watch for the client leaving.
  if (in_exchange_ && !ending_ && !watching_) watch_disconnect();
}

void Session::add_common_headers(http::fields& f) const {
  f.set(http::field::server, "llm-server");
  if (!state_->config.cors_origin.empty()) {
    f.set(http::field::access_control_allow_origin, state_->config.cors_origin);
    if (state_->config.cors_origin != "*") f.set(http::field::vary, "Origin");
  }
}

void Session::respond(uint64_t no, Response res) {
  if (!current(no)) return;
  if (streaming_) {
    // Headers are gone already: report the error inside the stream instead.
    send_event(no, "data: " + res.body() + "\n\n");
    return end_stream(no);
  }
  add_common_headers(res.base());
  const bool keep = keep_alive_ && !close_after_ && !state_->shutting_down;
  res.keep_alive(keep);
  res.prepare_payload();
  status_ = res.result_int();
  std::ostringstream os;
  os << res;
  write(os.str());
  end_exchange();
}

void Session::start_stream(uint64_t no) {
  if (!current(no) || streaming_) return;
  http::response<http::empty_body> res{http::status::ok, 11};
  res.set(http::field::content_type, "text/event-stream");
  res.set(http::field::cache_control, "no-cache");
  res.set("X-Accel-Buffering", "no");  // nginx: pass events through unbuffered
  add_common_headers(res.base());
  res.chunked(true);
  res.keep_alive(keep_alive_ && !state_->shutting_down);
  status_ = 200;
  streaming_ = true;
  std::ostringstream os;
  os << res.base();
  write(os.str());
  arm_ping();
}

void Session::send_event(uint64_t no, std::string data) {
  if (!current(no) || !streaming_) return;
  wrote_since_ping_ = true;
  write(chunk(data));
}

void Session::end_stream(uint64_t no) {
  if (!current(no) || !streaming_) return;
  ping_timer_.cancel();
  write("0\r\n\r\n");
  end_exchange();
}

void Session::on_disconnect(uint64_t no, std::function<void()> fn) {
  if (current(no)) on_disconnect_ = std::move(fn);
}

void Session::set_usage(uint64_t no, int64_t prompt, int64_t completion) {
  if (no != exchange_no_) return;
  prompt_tokens_ = prompt;
  completion_tokens_ = completion;
}

void Session::arm_ping() {
  // SSE comments keep proxies from timing out a stream that is silent during
  // a long prefill.
  wrote_since_ping_ = false;
  ping_timer_.expires_after(k_ping_interval);
  ping_timer_.async_wait([self = shared_from_this(), no = exchange_no_](beast::error_code ec) {
    if (ec || !self->current(no) || !self->streaming_) return;
    if (!self->wrote_since_ping_) self->write(chunk(": ping\n\n"));
    self->arm_ping();
  });
}

void Session::write(std::string bytes) {
  if (closed_) return;
  out_bytes_ += bytes.size();
  out_.push_back(std::move(bytes));
  if (out_bytes_ > k_max_queued_bytes) {
    spdlog::warn("{} {}: client is not reading; dropping the connection", method_, target_);
    return client_gone();
  }
  if (!writing_) do_write();
}

void Session::do_write() {
  writing_ = true;
  stream_.expires_after(std::chrono::seconds(state_->config.timeout_seconds));
  net::async_write(stream_, net::buffer(out_.front()), beast::bind_front_handler(&Session::on_write, shared_from_this()));
}

void Session::on_write(beast::error_code ec, size_t) {
  writing_ = false;
  if (ec) return client_gone();
  out_bytes_ -= out_.front().size();
  out_.pop_front();
  if (!out_.empty()) return do_write();
  if (in_exchange_ && ending_) finish_exchange();
}

void Session::end_exchange() {
  ending_ = true;
  if (!writing_ && out_.empty()) finish_exchange();
}

void Session::finish_exchange() {
  in_exchange_ = false;
  ending_ = false;
  streaming_ = false;
  on_disconnect_ = nullptr;
  --state_->n_open_exchanges;
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started_).count();
  if (prompt_tokens_ >= 0) {
    spdlog::info("{} {} {} prompt_tokens={} completion_tokens={} {:.1f}ms", method_, target_, status_, prompt_tokens_,
                 completion_tokens_, ms);
  } else {
    spdlog::info("{} {} {} {:.1f}ms", method_, target_, status_, ms);
  }
  if (close_after_ || !keep_alive_ || state_->shutting_down) return close();
  if (watching_) {
    // Stop the disconnect watch; its handler then reads the next request.
    read_after_watch_ = true;
    beast::error_code ignored;
    stream_.socket().cancel(ignored);
    return;
  }
  do_read();
}

void Session::watch_disconnect() {
  if (closed_ || buffer_.size() > k_max_pipelined_bytes) return;
  watching_ = true;
  stream_.expires_never();
  stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
    self->watching_ = false;
    if (!ec) {
      self->read_after_watch_ = false;
      self->buffer_.commit(n);  // a pipelined request: keep it for the next read
      if (self->in_exchange_ && !self->ending_) return self->watch_disconnect();
      if (!self->in_exchange_) return self->do_read();
      return;
    }
    if (ec == net::error::operation_aborted && self->read_after_watch_) {
      self->read_after_watch_ = false;
      return self->do_read();
    }
    if (self->in_exchange_) self->client_gone();
  });
}

void Session::client_gone() {
  if (in_exchange_ && on_disconnect_) {
    auto fn = std::move(on_disconnect_);
    on_disconnect_ = nullptr;
    fn();
  }
  if (in_exchange_) {
    in_exchange_ = false;
    --state_->n_open_exchanges;
    spdlog::info("{} {} client disconnected", method_, target_);
  }
  close();
}

void Session::close() {
  if (closed_) return;
  closed_ = true;
  ping_timer_.cancel();
  beast::error_code ignored;
  stream_.socket().shutdown(net::ip::tcp::socket::shutdown_send, ignored);
  if (!close_after_) {
    stream_.socket().close(ignored);
    return;
  }
  // We answered before reading the whole request (e.g. 413): the client may
  // still be sending. Closing with unread data would reset the connection and
  // could destroy our answer in flight, so read and discard until the client
  // closes too, for a short while.
  stream_.expires_after(std::chrono::seconds(2));
  drain();
}

void Session::drain() {
  stream_.async_read_some(net::buffer(drain_buffer_), [self = shared_from_this()](beast::error_code ec, size_t) {
    if (!ec) return self->drain();
    beast::error_code ignored;
    self->stream_.socket().close(ignored);
  });
}

void SessionExchange::respond(Response res) {
  session_->run_on_strand([s = session_, no = no_, r = std::move(res)]() mutable { s->respond(no, std::move(r)); });
}
void SessionExchange::start_stream() {
  session_->run_on_strand([s = session_, no = no_] { s->start_stream(no); });
}
void SessionExchange::send_event(std::string data) {
  session_->run_on_strand([s = session_, no = no_, d = std::move(data)]() mutable { s->send_event(no, std::move(d)); });
}
void SessionExchange::end_stream() {
  session_->run_on_strand([s = session_, no = no_] { s->end_stream(no); });
}
void SessionExchange::on_disconnect(std::function<void()> fn) {
  session_->run_on_strand([s = session_, no = no_, f = std::move(fn)]() mutable { s->on_disconnect(no, std::move(f)); });
}
void SessionExchange::set_usage(int64_t prompt, int64_t completion) {
  session_->run_on_strand([s = session_, no = no_, prompt, completion] { s->set_usage(no, prompt, completion); });
}

}  // namespace llm::server
