#include "clients/http_client.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <limits>
#include <optional>
#include <system_error>
#include <utility>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace llm::clients {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// Bodies read whole: an error body only feeds a message to the user; a 2xx one (e.g. /v1/models) is
// small too, but a misdirected URL could serve anything.
constexpr size_t k_max_error_body = 64 * 1024;
constexpr size_t k_max_body = 64 * 1024 * 1024;

std::string to_std(beast::string_view s) { return std::string(s.data(), s.size()); }

// Beast's synchronous calls have no timeouts (and asio's blocking reads ignore SO_RCVTIMEO), so each
// step is started asynchronously and the private io_context is run until that step completes. The
// stream's own deadline (tcp_stream::expires_after) and the cancel watch run in the same loop.
template <typename Start>
beast::error_code run_step(asio::io_context& ioc, Start&& start) {
  beast::error_code result = asio::error::operation_aborted;
  bool done = false;
  start([&](beast::error_code ec, auto&&...) {
    result = ec;
    done = true;
  });
  ioc.restart();
  while (!done && ioc.run_one() > 0) {
  }
  return result;
}

[[noreturn]] void fail(TransportError::Stage stage, const std::string& what, const beast::error_code& ec,
                       std::chrono::seconds timeout) {
  if (ec == beast::error::timeout) {
    const std::string seconds = std::to_string(timeout.count()) + " s";
    throw TransportError(stage, what + (stage == TransportError::Stage::connect ? ": timed out after " + seconds
                                                                                 : ": no progress for " + seconds));
  }
  if (ec == asio::error::eof || ec == http::error::end_of_stream || ec == http::error::partial_message) {
    throw TransportError(stage, what + ": the server closed the connection");
  }
  throw TransportError(stage, what + ": " + ec.message());
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

}  // namespace

std::string Endpoint::host_header() const {
  const bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + port;
}

std::string Endpoint::to_string() const { return "http://" + host_header() + base_path; }

Endpoint parse_url(std::string_view url) {
  const std::string quoted = "'" + std::string(url) + "'";
  std::string_view rest = url;
  if (const size_t sep = rest.find("://"); sep != std::string_view::npos) {
    const std::string scheme = lower(rest.substr(0, sep));
    if (scheme == "https") {
      throw std::invalid_argument("https:// is not supported (" + quoted +
                                  "): llm-chat speaks plain HTTP, as llm-server serves; use http://");
    }
    if (scheme != "http") throw std::invalid_argument("unsupported URL scheme in " + quoted + "; use http://HOST:PORT");
    rest.remove_prefix(sep + 3);
  }
  if (rest.find_first_of("?#@") != std::string_view::npos) {
    throw std::invalid_argument("unsupported URL " + quoted + ": expected http://HOST[:PORT][/PATH]");
  }
  const size_t slash = rest.find('/');
  const std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash);

  Endpoint ep;
  std::string_view port;
  if (!authority.empty() && authority.front() == '[') {  // [IPv6]:port
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) throw std::invalid_argument("unterminated '[' in URL " + quoted);
    ep.host = authority.substr(1, close - 1);
    const std::string_view after = authority.substr(close + 1);
    if (!after.empty() && after.front() != ':') throw std::invalid_argument("bad URL " + quoted);
    if (!after.empty()) port = after.substr(1);
  } else {
    const size_t colon = authority.find(':');
    if (colon != std::string_view::npos && authority.find(':', colon + 1) != std::string_view::npos) {
      throw std::invalid_argument("IPv6 addresses in URLs need brackets, e.g. http://[::1]:8080 (got " + quoted + ")");
    }
    ep.host = authority.substr(0, colon);
    if (colon != std::string_view::npos) port = authority.substr(colon + 1);
  }
  if (ep.host.empty()) throw std::invalid_argument("no host in URL " + quoted);
  if (port.empty()) {
    ep.port = "80";
  } else {
    const bool digits = std::all_of(port.begin(), port.end(), [](unsigned char c) { return std::isdigit(c); });
    if (!digits || port.size() > 5 || std::stoi(std::string(port)) == 0 || std::stoi(std::string(port)) > 65535) {
      throw std::invalid_argument("bad port in URL " + quoted);
    }
    ep.port = port;
  }
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  // Endpoints are addressed as /v1/..., so an OpenAI-style base URL ending in /v1 means its parent.
  if (path.size() >= 3 && path.substr(path.size() - 3) == "/v1") path.remove_suffix(3);
  ep.base_path = path;
  return ep;
}

HttpClient::HttpClient(Endpoint endpoint, std::string api_key, Timeouts timeouts)
    : endpoint_(std::move(endpoint)), api_key_(std::move(api_key)), timeouts_(timeouts) {}

HttpResponse HttpClient::get(std::string_view target) const { return send(false, target, {}, {}, -1); }

HttpResponse HttpClient::post_json(std::string_view target, const std::string& json, const BodySink& on_body,
                                   int cancel_fd) const {
  return send(true, target, json, on_body, cancel_fd);
}

HttpResponse HttpClient::send(bool post, std::string_view target, const std::string& body,
                              const BodySink& on_body, int cancel_fd) const {
  asio::io_context ioc;
  tcp::resolver resolver(ioc);
  beast::tcp_stream stream(ioc);
  HttpResponse out;

  // Cancellation: when cancel_fd turns readable, abort whatever step is pending. The descriptor is
  // dup'ed because asio closes the one it owns; the caller keeps (and drains) the original.
  std::optional<asio::posix::stream_descriptor> cancel_watch;
  if (cancel_fd >= 0) {
    const int fd = ::dup(cancel_fd);
    if (fd < 0) throw std::system_error(errno, std::generic_category(), "dup");
    cancel_watch.emplace(ioc, fd);
    cancel_watch->async_wait(asio::posix::descriptor_base::wait_read, [&](beast::error_code ec) {
      if (ec) return;  // the watch itself was cancelled
      out.cancelled = true;
      resolver.cancel();
      stream.close();
    });
  }

  const std::string where = endpoint_.host_header();
  tcp::resolver::results_type addresses;
  beast::error_code ec = run_step(ioc, [&](auto done) {
    resolver.async_resolve(endpoint_.host, endpoint_.port,
                           [&, done](beast::error_code e, tcp::resolver::results_type r) mutable {
                             addresses = std::move(r);
                             done(e);
                           });
  });
  if (out.cancelled) return out;
  if (ec) fail(TransportError::Stage::connect, "cannot resolve " + endpoint_.host, ec, timeouts_.connect);

  stream.expires_after(timeouts_.connect);
  ec = run_step(ioc, [&](auto done) { stream.async_connect(addresses, done); });
  if (out.cancelled) return out;
  if (ec) fail(TransportError::Stage::connect, "cannot connect to " + where, ec, timeouts_.connect);

  http::request<http::string_body> req{post ? http::verb::post : http::verb::get,
                                       endpoint_.base_path + std::string(target), 11};
  req.set(http::field::host, endpoint_.host_header());
  req.set(http::field::user_agent, "llm-chat");
  req.keep_alive(false);  // one request per connection: closing it is the cancel signal
  if (!api_key_.empty()) req.set(http::field::authorization, "Bearer " + api_key_);
  if (post) {
    req.set(http::field::content_type, "application/json");
    req.body() = body;
  }
  req.prepare_payload();
  stream.expires_after(timeouts_.idle);
  ec = run_step(ioc, [&](auto done) { http::async_write(stream, req, done); });
  if (out.cancelled) return out;
  if (ec) fail(TransportError::Stage::exchange, "sending the request to " + where + " failed", ec, timeouts_.idle);

  // buffer_body + read_some hands over body bytes as soon as they arrive, whatever the framing
  // (chunked, Content-Length or close-delimited), which is what token streaming needs.
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  // A streamed reply is as long as the generation. (Not boost::none: Boost 1.74 compares the
  // Content-Length against the empty optional and rejects every sized body.)
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  stream.expires_after(timeouts_.idle);
  ec = run_step(ioc, [&](auto done) { http::async_read_header(stream, buffer, parser, done); });
  if (out.cancelled) return out;
  if (ec) fail(TransportError::Stage::exchange, "no response from " + where, ec, timeouts_.idle);

  const auto& head = parser.get();
  out.status = head.result_int();
  out.reason = to_std(head.reason());
  out.content_type = to_std(head[http::field::content_type]);
  const bool stream_body = on_body && out.status / 100 == 2;
  const size_t max_body = out.status / 100 == 2 ? k_max_body : k_max_error_body;

  std::array<char, 16 * 1024> chunk;
  while (!parser.is_done()) {
    parser.get().body().data = chunk.data();
    parser.get().body().size = chunk.size();
    stream.expires_after(timeouts_.idle);
    ec = run_step(ioc, [&](auto done) { http::async_read_some(stream, buffer, parser, done); });
    if (out.cancelled) return out;
    if (ec == http::error::need_buffer) ec = {};  // the chunk buffer is full; hand it over and go on
    if (ec) {
      fail(TransportError::Stage::exchange, "reading the response from " + where + " failed", ec, timeouts_.idle);
    }
    const std::string_view got(chunk.data(), chunk.size() - parser.get().body().size);
    if (stream_body) {
      if (!got.empty() && !on_body(got)) break;
    } else if (out.body.size() < max_body) {
      out.body.append(got.substr(0, max_body - out.body.size()));
    }
  }
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  return out;
}

}  // namespace llm::clients
