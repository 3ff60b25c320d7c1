#pragma once
// One TCP connection: reads requests (header and body limits, timeouts),
// dispatches them, and writes responses through a bounded queue, all on the
// connection's own strand. While a response is pending it keeps a read open
// to notice a client that disconnects, so its generation can be cancelled.
#include <boost/asio/dispatch.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <array>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>

#include "server/app_state.h"
#include "server/exchange.h"

namespace llm::server {

class Router;

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(boost::asio::ip::tcp::socket socket, std::shared_ptr<AppState> state, const Router& router);
  void start();

  // Exchange operations, on the strand; `no` identifies the exchange.
  void respond(uint64_t no, Response res);
  void start_stream(uint64_t no);
  void send_event(uint64_t no, std::string data);
  void end_stream(uint64_t no);
  void on_disconnect(uint64_t no, std::function<void()> fn);
  void set_usage(uint64_t no, int64_t prompt, int64_t completion);

  template <typename Fn>
  void run_on_strand(Fn&& fn) {
    boost::asio::dispatch(stream_.get_executor(), std::forward<Fn>(fn));
  }

 private:
  void do_read();
  void on_header(boost::beast::error_code ec, size_t bytes);
  void read_body();
  void on_read(boost::beast::error_code ec, size_t bytes);
  void handle(Request req);
  void reply_error(int status, const std::string& type, const std::string& message, bool close);
  void write(std::string bytes);
  void do_write();
  void on_write(boost::beast::error_code ec, size_t bytes);
  void watch_disconnect();
  void end_exchange();
  void finish_exchange();  // after the last byte of a response is written
  void client_gone();
  void close();
  void drain();
  void arm_ping();
  void add_common_headers(http::fields& f) const;
  bool current(uint64_t no) const { return no == exchange_no_ && in_exchange_ && !ending_; }

  boost::beast::tcp_stream stream_;
  boost::beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<AppState> state_;
  const Router& router_;

  std::deque<std::string> out_;
  size_t out_bytes_ = 0;
  bool writing_ = false;
  bool closed_ = false;

  // The current exchange.
  uint64_t exchange_no_ = 0;
  bool in_exchange_ = false;
  bool ending_ = false;      // response complete, bytes still being written
  bool streaming_ = false;
  bool keep_alive_ = true;
  bool close_after_ = false;
  bool watching_ = false;    // disconnect-watch read pending
  bool read_after_watch_ = false;
  std::function<void()> on_disconnect_;
  std::string method_, target_;
  int status_ = 0;
  int64_t prompt_tokens_ = -1, completion_tokens_ = -1;
  std::chrono::steady_clock::time_point started_;

  std::array<char, 4096> drain_buffer_;
  boost::asio::steady_timer ping_timer_;
  bool wrote_since_ping_ = false;
};

// Handed to handlers; forwards to the session on its strand.
class SessionExchange : public Exchange {
 public:
  SessionExchange(std::shared_ptr<Session> s, uint64_t no) : session_(std::move(s)), no_(no) {}
  void respond(Response res) override;
  void start_stream() override;
  void send_event(std::string data) override;
  void end_stream() override;
  void on_disconnect(std::function<void()> fn) override;
  void set_usage(int64_t prompt, int64_t completion) override;

 private:
  std::shared_ptr<Session> session_;
  uint64_t no_;
};

}  // namespace llm::server
