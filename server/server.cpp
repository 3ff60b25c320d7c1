#include "server/server.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <ctime>
#include <thread>

#include "server/app_state.h"
#include "server/listener.h"
#include "server/router.h"

namespace llm::server {

namespace net = boost::asio;

namespace {

// %* in the JSON pattern: the message, escaped as a JSON string body.
class JsonMessageFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    for (char c : msg.payload) {
      switch (c) {
        case '"': dest.append(std::string_view("\\\"")); break;
        case '\\': dest.append(std::string_view("\\\\")); break;
        case '\n': dest.append(std::string_view("\\n")); break;
        case '\r': dest.append(std::string_view("\\r")); break;
        case '\t': dest.append(std::string_view("\\t")); break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            const char hex[] = "0123456789abcdef";
            const char esc[] = {'\\', 'u', '0', '0', hex[(c >> 4) & 0xF], hex[c & 0xF]};
            dest.append(esc, esc + 6);
          } else {
            dest.push_back(c);
          }
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<JsonMessageFlag>(); }
};

void load_model(const std::shared_ptr<AppState>& state) {
  const ServerConfig& c = state->config;
  auto model = engine::Model::load(c.model_path);
  auto tokenizer = std::make_unique<weights::Tokenizer>(model->checkpoint().load_tokenizer());
  auto tmpl = std::make_unique<weights::ChatTemplate>(model->checkpoint().load_chat_template(*tokenizer));
  engine::EngineOptions opts;
  opts.n_threads = c.threads;
  opts.n_parallel = c.parallel;
  opts.n_ctx = c.ctx > 0 ? c.ctx : std::min<int64_t>(model->config().n_ctx_train, 4096);
  opts.max_queue = c.max_queue;
  opts.prefill_chunk = c.prefill_chunk;
  if (opts.n_ctx > model->config().n_ctx_train) {
    spdlog::warn("--ctx {} exceeds the model's trained context of {}", opts.n_ctx, model->config().n_ctx_train);
  }
  state->default_model_name = model->checkpoint().default_name();
  state->model_name = c.model_alias.empty() ? state->default_model_name : c.model_alias;
  state->created = std::time(nullptr);
  state->engine = std::make_unique<engine::Engine>(model, *tokenizer, opts);
  state->tokenizer = std::move(tokenizer);
  state->chat_template = std::move(tmpl);
  state->model = std::move(model);
  state->ready.store(true, std::memory_order_release);
  spdlog::info("model '{}' ready: context {}, {} parallel sequences, chat template: {}", state->model_name, opts.n_ctx,
               opts.n_parallel, state->chat_template->is_fallback() ? "plain fallback" : "from the model");
}

}  // namespace

void setup_logging(const std::string& format) {
  auto logger = spdlog::stderr_color_mt("llm-server");
  if (format == "json") {
    auto f = std::make_unique<spdlog::pattern_formatter>();
    f->add_flag<JsonMessageFlag>('*').set_pattern(R"({"time":"%Y-%m-%dT%H:%M:%S.%e%z","level":"%l","msg":"%*"})");
    logger->set_formatter(std::move(f));
  } else {
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  }
  spdlog::set_default_logger(logger);
  spdlog::flush_on(spdlog::level::info);
}

int run_server(const ServerConfig& config) {
  auto state = std::make_shared<AppState>(config);
  net::io_context ioc{1};
  Router router;

  std::shared_ptr<Listener> listener;
  try {
    listener = std::make_shared<Listener>(ioc, net::ip::tcp::endpoint(net::ip::make_address(config.host), config.port),
                                          state, router);
  } catch (const std::exception& e) {
    spdlog::error("cannot listen on {}:{}: {}", config.host, config.port, e.what());
    return 1;
  }
  const auto ep = listener->local_endpoint();
  spdlog::info("listening on http://{}:{}", ep.address().to_string(), ep.port());
  listener->start();

  std::atomic<int> exit_code{0};
  std::thread loader([&] {
    try {
      load_model(state);
    } catch (const std::exception& e) {
      spdlog::error("cannot load the model: {}", e.what());
      exit_code = 1;
      state->shutting_down = true;
      listener->stop();
      ioc.stop();
    }
  });

  // Shutdown runs off the io thread: draining the engine blocks.
  std::thread stopper;
  net::signal_set signals(ioc, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    spdlog::info("signal {}: shutting down (running requests get {} s)", sig, config.shutdown_timeout_seconds);
    state->shutting_down = true;
    listener->stop();
    stopper = std::thread([&] {
      if (loader.joinable()) loader.join();
      if (state->engine) state->engine->shutdown(std::chrono::seconds(config.shutdown_timeout_seconds));
      // Let the last events of each stream reach their sockets.
      for (int i = 0; i < 200 && state->n_open_exchanges.load() > 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      ioc.stop();
    });
  });

  ioc.run();
  if (stopper.joinable()) stopper.join();
  if (loader.joinable()) loader.join();
  state->engine.reset();
  spdlog::info("stopped");
  return exit_code;
}

}  // namespace llm::server
