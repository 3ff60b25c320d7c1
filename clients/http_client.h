#pragma once
// A small blocking HTTP/1.1 client (plain http only) for talking to llm-server: one connection per
// request, connect and inactivity timeouts, response bodies delivered as they arrive, and cancellation
// by a file descriptor becoming readable (llm-chat's SIGINT self-pipe). Cancelling closes the
// connection, which is how the server learns to stop generating.
#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace llm::clients {

// Where the server is, from a base URL such as `http://127.0.0.1:8080`.
struct Endpoint {
  std::string host;       // IPv6 literals without their brackets
  std::string port;
  std::string base_path;  // "" or "/prefix" (no trailing '/'), put before every request target

  std::string host_header() const;  // "host:port", IPv6 in brackets
  std::string to_string() const;    // "http://host:port/prefix"
};

// Accepts `http://host[:port][/prefix]` (port 80 when absent) or `host:port`. A trailing `/v1` is
// dropped so that the base URL OpenAI SDKs take works too. Throws std::invalid_argument with a message
// for the user, e.g. for https:// (no TLS here).
Endpoint parse_url(std::string_view url);

// The request never got a complete HTTP response: unresolvable host, refused, reset, timed out.
struct TransportError : std::runtime_error {
  enum class Stage { connect, exchange };  // connect: no connection was made (server down, wrong URL)
  TransportError(Stage stage, const std::string& message) : std::runtime_error(message), stage(stage) {}
  Stage stage;
};

struct HttpResponse {
  unsigned status = 0;
  std::string reason;
  std::string content_type;
  std::string body;        // all of it, unless a 2xx body went to the caller's BodySink instead
  bool cancelled = false;  // the cancel descriptor fired first; the connection was closed
};

struct Timeouts {
  std::chrono::seconds connect{10};
  std::chrono::seconds idle{300};  // longest wait for the next bytes (a long prompt can take a while)
};

// Receives a 2xx response body piece by piece; returning false stops reading and closes the connection.
using BodySink = std::function<bool(std::string_view)>;

class HttpClient {
 public:
  HttpClient(Endpoint endpoint, std::string api_key, Timeouts timeouts = {});

  const Endpoint& endpoint() const { return endpoint_; }
  const Timeouts& timeouts() const { return timeouts_; }

  HttpResponse get(std::string_view target) const;

  // POSTs a JSON body. With `on_body`, a 2xx response body is streamed to it; error bodies are always
  // collected in HttpResponse::body. If `cancel_fd` (>= 0) becomes readable before the response is
  // complete, the connection is closed and the response comes back with `cancelled` set.
  HttpResponse post_json(std::string_view target, const std::string& json, const BodySink& on_body = {},
                         int cancel_fd = -1) const;

 private:
  HttpResponse send(bool post, std::string_view target, const std::string& body, const BodySink& on_body,
                    int cancel_fd) const;

  Endpoint endpoint_;
  std::string api_key_;
  Timeouts timeouts_;
};

}  // namespace llm::clients
