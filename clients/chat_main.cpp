// llm-chat: a terminal chat with llm-server through its OpenAI-compatible HTTP API. It keeps the
// conversation, streams each reply as it is generated, and Ctrl-C cancels a reply without leaving.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <system_error>

#include <nlohmann/json.hpp>

#include "clients/http_client.h"
#include "clients/sse.h"

namespace {

using nlohmann::json;
using namespace llm::clients;

const char* k_usage =
    "usage: llm-chat [--url URL] [--api-key KEY] [--system TEXT] [--temp T] [--max-tokens N]\n"
    "                [--model NAME] [--timeout SECONDS] [--once]\n"
    "  Chats with llm-server (or another OpenAI-compatible server), streaming each reply.\n"
    "  --url         server base URL (default http://127.0.0.1:8080)\n"
    "  --api-key     bearer token (default: $LLM_API_KEY)\n"
    "  --system      system message that opens the conversation\n"
    "  --temp, --max-tokens, --model\n"
    "                sent as temperature, max_tokens and model; the server's defaults otherwise\n"
    "  --timeout     give up when the server sends nothing for this long (default 300)\n"
    "  --once        send all of stdin as one message, print the reply, exit\n"
    "  In the chat: /reset clears the history, /exit quits (so do Ctrl-D and Ctrl-C twice at the\n"
    "  prompt), Ctrl-C during a reply cancels it. The prompt is shown when stdin is a terminal;\n"
    "  otherwise each line of stdin is one message.\n"
    "  Exit status: 0 ok, 1 a request failed, 2 bad usage, 130 interrupted.\n";

constexpr int k_exit_failed = 1;
constexpr int k_exit_usage = 2;
constexpr int k_exit_interrupted = 130;  // the shell's 128 + SIGINT

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "llm-chat: %s\n%s", msg.c_str(), k_usage);
  std::exit(k_exit_usage);
}

struct Options {
  std::string url = "http://127.0.0.1:8080";
  std::string api_key;
  std::string system;
  std::string model;
  std::optional<double> temperature;
  std::optional<long long> max_tokens;
  long long timeout_seconds = 300;
  bool once = false;
};

template <typename T>
T parse_number(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    T out;
    if constexpr (std::is_floating_point_v<T>) out = std::stod(v, &used);
    else out = std::stoll(v, &used);
    if (used != v.size()) throw std::invalid_argument(v);
    return out;
  } catch (const std::exception&) {
    usage_error(flag + " expects a number, got '" + v + "'");
  }
}

Options parse_args(int argc, char** argv) {
  Options opt;
  if (const char* key = std::getenv("LLM_API_KEY")) opt.api_key = key;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--url") opt.url = value();
    else if (a == "--api-key") opt.api_key = value();
    else if (a == "--system") opt.system = value();
    else if (a == "--model") opt.model = value();
    else if (a == "--temp" || a == "--temperature") opt.temperature = parse_number<double>(a, value());
    else if (a == "--max-tokens") opt.max_tokens = parse_number<long long>(a, value());
    else if (a == "--timeout") opt.timeout_seconds = parse_number<long long>(a, value());
    else if (a == "--once") opt.once = true;
    else if (a == "--help" || a == "-h") {
      std::fputs(k_usage, stdout);
      std::exit(0);
    } else usage_error("unknown argument '" + a + "'");
  }
  if (opt.temperature && *opt.temperature < 0) usage_error("--temp must be >= 0");
  if (opt.max_tokens && *opt.max_tokens <= 0) usage_error("--max-tokens must be positive");
  if (opt.timeout_seconds <= 0) usage_error("--timeout must be positive");
  return opt;
}

// SIGINT writes a byte into a pipe. Whatever waits (for stdin, for the server) polls that pipe along
// with its real work, so a Ctrl-C can't slip in between checking a flag and blocking in a system call.
class SigintPipe {
 public:
  SigintPipe() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
    read_fd_ = fds[0];
    s_write_fd = fds[1];
    struct sigaction sa {};
    sa.sa_handler = &on_sigint;
    sigemptyset(&sa.sa_mask);
    // Restart interrupted writes to the terminal (an EINTR there would drop reply text); poll() and
    // epoll_wait() return early regardless, and the pipe then says why.
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGINT, &sa, &previous_);
    // Started with SIGINT ignored (nohup, `cmd &` in a script): Ctrl-C is not meant for us; keep it so.
    if (previous_.sa_handler == SIG_IGN) ::sigaction(SIGINT, &previous_, nullptr);
  }
  ~SigintPipe() {
    ::sigaction(SIGINT, &previous_, nullptr);
    ::close(read_fd_);
    ::close(s_write_fd);
  }
  SigintPipe(const SigintPipe&) = delete;
  SigintPipe& operator=(const SigintPipe&) = delete;

  int fd() const { return read_fd_; }

  // Empties the pipe; true if Ctrl-C was pressed since the last call.
  bool take() {
    char buf[64];
    bool any = false;
    while (::read(read_fd_, buf, sizeof buf) > 0) any = true;
    return any;
  }

 private:
  static void on_sigint(int) {
    const int saved = errno;  // only async-signal-safe calls here
    const char byte = 1;
    [[maybe_unused]] const ssize_t n = ::write(s_write_fd, &byte, 1);  // full pipe: Ctrl-C is pending anyway
    errno = saved;
  }

  static inline volatile std::sig_atomic_t s_write_fd = -1;
  int read_fd_ = -1;
  struct sigaction previous_ {};
};

enum class Input { text, eof, interrupted };

// Reads stdin with poll(2) + read(2) next to the SIGINT pipe: std::getline can't be woken by Ctrl-C.
class StdinReader {
 public:
  explicit StdinReader(SigintPipe& sigint) : sigint_(sigint) {}

  // The next line, without its line ending.
  Input next_line(std::string& line) {
    for (;;) {
      if (const size_t nl = buffer_.find('\n'); nl != std::string::npos) {
        line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return Input::text;
      }
      if (eof_) {
        if (buffer_.empty()) return Input::eof;
        line = std::exchange(buffer_, {});
        return Input::text;
      }
      if (fill() == Input::interrupted) return Input::interrupted;
    }
  }

  // Everything up to the end of the input.
  Input read_all(std::string& text) {
    while (!eof_) {
      if (fill() == Input::interrupted) return Input::interrupted;
    }
    text = std::exchange(buffer_, {});
    return Input::text;
  }

 private:
  Input fill() {
    pollfd fds[2] = {{STDIN_FILENO, POLLIN, 0}, {sigint_.fd(), POLLIN, 0}};
    for (;;) {
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        throw std::system_error(errno, std::generic_category(), "poll");
      }
      if (fds[1].revents != 0) {
        sigint_.take();
        buffer_.clear();  // Ctrl-C discards what was typed, as the terminal itself does
        return Input::interrupted;
      }
      if (fds[0].revents != 0) break;  // data, hang-up or error: read() tells which
    }
    char buf[4096];
    ssize_t n;
    do n = ::read(STDIN_FILENO, buf, sizeof buf);
    while (n < 0 && errno == EINTR);
    if (n < 0) throw std::system_error(errno, std::generic_category(), "reading stdin");
    if (n == 0) eof_ = true;
    buffer_.append(buf, static_cast<size_t>(n));
    return Input::text;
  }

  SigintPipe& sigint_;
  std::string buffer_;
  bool eof_ = false;
};

std::string trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  return std::string(s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1));
}

std::string abbreviate(std::string_view s, size_t max = 300) {
  return s.size() <= max ? std::string(s) : std::string(s.substr(0, max)) + "...";
}

// The string at `ptr`, or "" when it is absent or not a string (e.g. `"content": null`).
std::string string_at(const json& j, const json::json_pointer& ptr) {
  if (!j.contains(ptr)) return {};
  const json& v = j.at(ptr);
  return v.is_string() ? v.get<std::string>() : std::string{};
}

// "message [code]" from an OpenAI error object {"message", "type", "param", "code"}.
std::string error_text(const json& error) {
  static const json::json_pointer message("/message"), code("/code"), type("/type");
  if (error.is_string()) return error.get<std::string>();
  std::string text = string_at(error, message);
  if (text.empty()) return abbreviate(error.dump());
  std::string tag = string_at(error, code);
  if (tag.empty()) tag = string_at(error, type);
  return tag.empty() ? text : text + " [" + tag + "]";
}

void report_http_error(const HttpResponse& r) {
  const json body = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  const bool openai_error = body.is_object() && body.contains("error");
  std::string message = openai_error ? error_text(body["error"]) : trim(r.body);
  if (message.empty()) message = "(no details)";
  std::fprintf(stderr, "llm-chat: HTTP %u %s: %s\n", r.status, r.reason.c_str(), abbreviate(message, 2000).c_str());
  const char* hint = nullptr;
  if (r.status == 401) hint = "pass --api-key KEY or set LLM_API_KEY to the server's key";
  else if (r.status == 404 && openai_error && string_at(body, json::json_pointer("/error/code")) == "model_not_found")
    hint = "leave out --model, or use the name GET /v1/models lists";
  else if (r.status == 404) hint = "--url should be the server's base URL, e.g. http://127.0.0.1:8080";
  else if (r.status == 429) hint = "the server's queue is full; try again shortly";
  else if (r.status == 503) hint = "the server is still loading the model or is shutting down; try again shortly";
  if (hint) std::fprintf(stderr, "llm-chat: hint: %s\n", hint);
}

void report_transport_error(const TransportError& e, const Endpoint& endpoint) {
  std::fprintf(stderr, "llm-chat: %s\n", e.what());
  if (e.stage == TransportError::Stage::connect) {
    std::fprintf(stderr,
                 "llm-chat: hint: is llm-server running at %s? Start it with `llm-server --model PATH`, "
                 "or point --url at it.\n",
                 endpoint.to_string().c_str());
  }
}

struct Reply {
  enum class Status { ok, cancelled, failed };
  Status status = Status::failed;
  std::string content;
  std::string finish_reason;
};

// Requests a streamed chat completion of `messages`, writes the reply to stdout as it arrives and
// returns it. Errors are reported on stderr.
Reply stream_reply(const HttpClient& client, const Options& opt, const json& messages, SigintPipe& sigint) {
  static const json::json_pointer content_ptr("/choices/0/delta/content"),
      finish_ptr("/choices/0/finish_reason");
  json request = {{"messages", messages}, {"stream", true}};
  if (!opt.model.empty()) request["model"] = opt.model;
  if (opt.temperature) request["temperature"] = *opt.temperature;
  if (opt.max_tokens) request["max_tokens"] = *opt.max_tokens;

  Reply reply;
  std::string stream_error;
  bool done = false;
  SseParser sse;
  const auto on_event = [&](const SseEvent& event) {
    if (event.data == "[DONE]") {
      done = true;
      return false;
    }
    const json chunk = json::parse(event.data, nullptr, /*allow_exceptions=*/false);
    if (!chunk.is_object()) {
      stream_error = "unexpected data in the stream: " + abbreviate(event.data);
      return false;
    }
    if (chunk.contains("error")) {  // generation failed after the stream began; [DONE] follows
      stream_error = error_text(chunk["error"]);
      return true;
    }
    if (const std::string piece = string_at(chunk, content_ptr); !piece.empty()) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      reply.content += piece;
    }
    if (std::string reason = string_at(chunk, finish_ptr); !reason.empty()) reply.finish_reason = std::move(reason);
    return true;
  };

  sigint.take();  // a Ctrl-C pressed before this request is not meant for it
  HttpResponse response;
  std::optional<TransportError> transport_error;
  try {
    response = client.post_json(
        "/v1/chat/completions", request.dump(), [&](std::string_view bytes) { return sse.feed(bytes, on_event); },
        sigint.fd());
  } catch (const TransportError& e) {
    transport_error = e;
  }
  if (!reply.content.empty() && reply.content.back() != '\n') std::fputc('\n', stdout);
  std::fflush(stdout);

  if (transport_error) {
    report_transport_error(*transport_error, client.endpoint());
  } else if (response.cancelled) {
    reply.status = Reply::Status::cancelled;
  } else if (response.status / 100 != 2) {
    report_http_error(response);
  } else if (!stream_error.empty()) {
    std::fprintf(stderr, "llm-chat: the server reported an error during the reply: %s\n", stream_error.c_str());
  } else if (!done) {
    std::fprintf(stderr, "llm-chat: the reply ended without `data: [DONE]`%s\n",
                 response.content_type.starts_with("text/event-stream")
                     ? " (the server closed the stream early)"
                     : (" (expected an event stream, got Content-Type '" + response.content_type + "')").c_str());
  } else {
    reply.status = Reply::Status::ok;
  }
  return reply;
}

json system_and_user(const Options& opt) {
  json messages = json::array();
  if (!opt.system.empty()) messages.push_back({{"role", "system"}, {"content", opt.system}});
  return messages;
}

// --once: all of stdin is one user message; the reply goes to stdout.
int run_once(const HttpClient& client, const Options& opt, StdinReader& input, SigintPipe& sigint) {
  std::string text;
  if (input.read_all(text) == Input::interrupted) return k_exit_interrupted;
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();  // echo's newline
  if (trim(text).empty()) {
    std::fputs("llm-chat: --once sends stdin as the message, but stdin was empty\n", stderr);
    return k_exit_usage;
  }
  json messages = system_and_user(opt);
  messages.push_back({{"role", "user"}, {"content", text}});
  const Reply reply = stream_reply(client, opt, messages, sigint);
  switch (reply.status) {
    case Reply::Status::ok: return 0;
    case Reply::Status::cancelled: std::fputs("llm-chat: cancelled\n", stderr); return k_exit_interrupted;
    case Reply::Status::failed: break;
  }
  return k_exit_failed;
}

void print_banner(const HttpClient& client) {
  // Asking for the model list checks the URL and the key before the user types anything.
  std::string model;
  try {
    const HttpResponse r = client.get("/v1/models");
    if (r.status / 100 != 2) return report_http_error(r);
    model = string_at(json::parse(r.body, nullptr, false), json::json_pointer("/data/0/id"));
  } catch (const TransportError& e) {
    return report_transport_error(e, client.endpoint());
  }
  std::fprintf(stderr, "llm-chat: connected to %s%s. Ctrl-C cancels a reply; /help lists commands.\n",
               client.endpoint().to_string().c_str(), model.empty() ? "" : (", model " + model).c_str());
}

// The chat loop: one line, one message; the history goes with every request.
int run_chat(const HttpClient& client, const Options& opt, StdinReader& input, SigintPipe& sigint) {
  const bool tty = ::isatty(STDIN_FILENO);
  json history = system_and_user(opt);
  bool failed = false;
  bool ctrl_c_at_prompt = false;
  if (tty) print_banner(client);
  for (;;) {
    if (tty) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    std::string line;
    const Input got = input.next_line(line);
    if (got == Input::eof) {
      if (tty) std::fputc('\n', stdout);
      break;
    }
    if (got == Input::interrupted) {
      if (!tty) return k_exit_interrupted;
      std::fputc('\n', stdout);
      if (ctrl_c_at_prompt) break;
      ctrl_c_at_prompt = true;  // one more in a row exits; a stray one only clears the line
      std::fputs("(Ctrl-C again or Ctrl-D to exit)\n", stderr);
      continue;
    }
    ctrl_c_at_prompt = false;
    const std::string text = trim(line);
    if (text.empty()) continue;
    if (text == "/exit" || text == "/quit") break;
    if (text == "/reset") {
      history = system_and_user(opt);
      if (tty) std::fputs("(history cleared)\n", stderr);
      continue;
    }
    if (text == "/help") {
      std::fputs("/reset clears the history, /exit quits; Ctrl-C cancels a reply, Ctrl-D exits.\n", stderr);
      continue;
    }
    if (text.front() == '/' && text.find(' ') == std::string::npos) {
      std::fprintf(stderr, "llm-chat: unknown command %s (/help lists them)\n", text.c_str());
      continue;
    }

    history.push_back({{"role", "user"}, {"content", text}});
    const Reply reply = stream_reply(client, opt, history, sigint);
    switch (reply.status) {
      case Reply::Status::ok:
        history.push_back({{"role", "assistant"}, {"content", reply.content}});
        if (tty && reply.finish_reason == "length") std::fputs("[cut off at the token limit]\n", stderr);
        break;
      case Reply::Status::cancelled:
        // A half reply would steer the next one; drop the whole turn so the user can rephrase it.
        history.erase(history.end() - 1);
        std::fputs("[cancelled; this turn is not kept in the history]\n", stderr);
        break;
      case Reply::Status::failed:
        history.erase(history.end() - 1);  // keep user/assistant turns alternating for a retry
        failed = true;
        break;
    }
    sigint.take();  // extra Ctrl-C presses while the reply was being cancelled belong to it
  }
  // Scripted use (stdin not a terminal) learns from the status whether every message got its reply.
  return !tty && failed ? k_exit_failed : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse_args(argc, argv);
  Endpoint endpoint;
  try {
    endpoint = parse_url(opt.url);
  } catch (const std::invalid_argument& e) {
    usage_error(e.what());
  }
  try {
    const Timeouts timeouts{.connect = std::chrono::seconds(10), .idle = std::chrono::seconds(opt.timeout_seconds)};
    const HttpClient client(endpoint, opt.api_key, timeouts);
    SigintPipe sigint;
    StdinReader input(sigint);
    return opt.once ? run_once(client, opt, input, sigint) : run_chat(client, opt, input, sigint);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llm-chat: %s\n", e.what());
    return k_exit_failed;
  }
}
