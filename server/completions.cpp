// /v1/chat/completions and /v1/completions: submit to the engine, then
// stream chunks as SSE events or answer once with the whole completion.
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <ctime>

#include "server/api_error.h"
#include "server/handlers.h"
#include "server/openai.h"
#include "server/router.h"

namespace llm::server {

using json = nlohmann::ordered_json;  // responses keep OpenAI's field order

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json byte_list(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

// State of one completion, shared by the handler and the engine callback.
// Engine events arrive on the engine thread, one at a time.
class CompletionJob {
 public:
  CompletionJob(AppState& state, std::shared_ptr<Exchange> ex, CompletionRequest req, const char* endpoint)
      : state_(state), ex_(std::move(ex)), req_(std::move(req)), endpoint_(endpoint),
        id_(make_id(req_.chat ? "chatcmpl-" : "cmpl-")), created_(std::time(nullptr)),
        start_(std::chrono::steady_clock::now()) {}

  const CompletionRequest& request() const { return req_; }

  void begin_stream() {
    ex_->start_stream();
    if (req_.chat) {
      // The first chat chunk announces the role, as OpenAI's does.
      send_chunk(json{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                      {"finish_reason", nullptr}});
    }
  }

  void on_event(engine::EngineEvent&& e) {
    if (e.kind == engine::EngineEvent::Kind::token) return on_token(e.token);
    on_done(e.result);
  }

 private:
  json logprob_entry(const engine::TokenEvent& t) const {
    const auto& tok = *state_.tokenizer;
    if (req_.chat) {
      json top = json::array();
      for (const auto& alt : t.top_logprobs) {
        const std::string piece = tok.token_bytes(alt.id);
        top.push_back({{"token", piece}, {"logprob", alt.logprob}, {"bytes", byte_list(piece)}});
      }
      const std::string piece = tok.token_bytes(t.id);
      return {{"token", piece}, {"logprob", *t.logprob}, {"bytes", byte_list(piece)}, {"top_logprobs", top}};
    }
    json top = json::object();
    for (const auto& alt : t.top_logprobs) top[tok.token_bytes(alt.id)] = alt.logprob;
    return {{"token", tok.token_bytes(t.id)}, {"logprob", *t.logprob}, {"top", top}};
  }

  // Completions' logprobs: parallel arrays.
  static void append_completion_logprobs(json& lp, const json& entry, size_t offset) {
    if (lp.is_null()) lp = {{"tokens", json::array()}, {"token_logprobs", json::array()},
                            {"top_logprobs", json::array()}, {"text_offset", json::array()}};
    lp["tokens"].push_back(entry["token"]);
    lp["token_logprobs"].push_back(entry["logprob"]);
    lp["top_logprobs"].push_back(entry["top"]);
    lp["text_offset"].push_back(offset);
  }

  void on_token(const engine::TokenEvent& t) {
    const auto now = std::chrono::steady_clock::now();
    if (t.id >= 0) {
      if (n_tokens_ == 0) {
        state_.metrics.observe_ttft(std::chrono::duration<double>(now - start_).count());
      } else {
        state_.metrics.observe_tpot(std::chrono::duration<double>(now - t_last_).count());
      }
      ++n_tokens_;
      t_last_ = now;
    }
    const bool with_logprobs = req_.logprobs && t.id >= 0 && t.logprob.has_value();
    if (!req_.stream) {
      if (with_logprobs) {
        const json entry = logprob_entry(t);
        if (req_.chat) {
          logprobs_.push_back(entry);
        } else {
          append_completion_logprobs(logprobs_, entry, text_.size());
        }
      }
      text_ += t.text;
      return;
    }
    if (t.text.empty() && !with_logprobs) return;
    json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    if (req_.chat) {
      choice["delta"] = {{"content", t.text}};
      if (with_logprobs) choice["logprobs"] = {{"content", json::array({logprob_entry(t)})}};
    } else {
      choice["text"] = t.text;
      if (with_logprobs) {
        json lp;
        append_completion_logprobs(lp, logprob_entry(t), streamed_bytes_);
        choice["logprobs"] = lp;
      }
    }
    streamed_bytes_ += t.text.size();
    send_chunk(choice);
  }

  void on_done(const engine::GenerationResult& r) {
    state_.metrics.add_tokens(r.n_prompt_tokens, r.n_generated_tokens);
    ex_->set_usage(r.n_prompt_tokens, r.n_generated_tokens);
    const json usage = {{"prompt_tokens", r.n_prompt_tokens},
                        {"completion_tokens", r.n_generated_tokens},
                        {"total_tokens", r.n_prompt_tokens + r.n_generated_tokens}};
    if (r.finish == engine::FinishReason::cancelled) {
      // The client left (nothing to send: counted as nginx's 499, "client
      // closed request", so it never looks like a server error) or the server is stopping.
      if (!state_.shutting_down) return state_.metrics.count_request(endpoint_, 499);
      state_.metrics.count_request(endpoint_, 503);
      const ApiError err(503, "server_error", "the server is shutting down; the request was cancelled", std::nullopt,
                         "shutting_down");
      if (req_.stream) {
        ex_->send_event("data: " + err.to_json() + "\n\n");
        ex_->send_event("data: [DONE]\n\n");
        ex_->end_stream();
      } else {
        ex_->respond(json_response(503, err.to_json()));
      }
      return;
    }
    const char* finish = engine::finish_reason_name(r.finish);
    state_.metrics.count_request(endpoint_, 200);
    if (req_.stream) {
      json last = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish}};
      if (req_.chat) {
        last["delta"] = json::object();
      } else {
        last["text"] = "";
      }
      send_chunk(last);
      if (req_.include_usage) {
        json chunk = envelope();
        chunk["choices"] = json::array();
        chunk["usage"] = usage;
        ex_->send_event("data: " + dump(chunk) + "\n\n");
      }
      ex_->send_event("data: [DONE]\n\n");
      ex_->end_stream();
      return;
    }
    json choice = {{"index", 0}};
    if (req_.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", text_}};
      choice["logprobs"] = req_.logprobs ? json{{"content", logprobs_.is_null() ? json::array() : logprobs_}} : json();
    } else {
      choice["text"] = text_;
      choice["logprobs"] = req_.logprobs ? logprobs_ : json();
    }
    choice["finish_reason"] = finish;
    json body = {{"id", id_},
                 {"object", req_.chat ? "chat.completion" : "text_completion"},
                 {"created", created_},
                 {"model", state_.model_name},
                 {"choices", json::array({choice})},
                 {"usage", usage}};
    ex_->respond(json_response(200, dump(body)));
  }

  json envelope() const {
    return {{"id", id_},
            {"object", req_.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", state_.model_name}};
  }

  void send_chunk(json choice) {
    json chunk = envelope();
    chunk["choices"] = json::array({std::move(choice)});
    if (req_.include_usage) chunk["usage"] = nullptr;
    ex_->send_event("data: " + dump(chunk) + "\n\n");
  }

  AppState& state_;
  std::shared_ptr<Exchange> ex_;
  CompletionRequest req_;
  const char* endpoint_;
  std::string id_;
  int64_t created_;
  std::chrono::steady_clock::time_point start_, t_last_;
  int64_t n_tokens_ = 0;
  std::string text_;
  json logprobs_;  // chat: array of entries; completions: parallel arrays
  size_t streamed_bytes_ = 0;
};

void handle(AppState& state, const Request& req, std::shared_ptr<Exchange> ex, bool chat) {
  const char* endpoint = chat ? "/v1/chat/completions" : "/v1/completions";
  std::shared_ptr<CompletionJob> job;
  try {
    job = std::make_shared<CompletionJob>(state, ex, parse_completion_request(state, req.body(), chat), endpoint);
  } catch (const ApiError& e) {
    state.metrics.count_request(endpoint, e.status);
    return ex->respond(json_response(e.status, e.to_json()));
  }
  std::pair<engine::SubmitStatus, engine::RequestId> submitted;
  try {
    submitted = state.engine->submit(job->request().gen, [job](engine::EngineEvent&& e) { job->on_event(std::move(e)); });
  } catch (const engine::RequestError& e) {
    state.metrics.count_request(endpoint, 400);
    return respond_error(*ex, 400, "invalid_request_error", e.what(), chat ? "messages" : "prompt");
  }
  const auto [status, id] = submitted;
  if (status == engine::SubmitStatus::queue_full) {
    state.metrics.count_request(endpoint, 429);
    return respond_error(*ex, 429, "rate_limit_error", "the server is busy: too many requests are waiting; retry later",
                         std::nullopt, "queue_full");
  }
  if (status == engine::SubmitStatus::shutting_down) {
    state.metrics.count_request(endpoint, 503);
    return respond_error(*ex, 503, "server_error", "the server is shutting down", std::nullopt, "shutting_down");
  }
  // A client that goes away cancels its generation; the slot frees within one step.
  ex->on_disconnect([&state, id] { state.engine->cancel(id); });
  if (job->request().stream) job->begin_stream();
}

}  // namespace

void handle_chat_completions(AppState& state, const Request& req, std::shared_ptr<Exchange> ex) {
  handle(state, req, std::move(ex), true);
}

void handle_completions(AppState& state, const Request& req, std::shared_ptr<Exchange> ex) {
  handle(state, req, std::move(ex), false);
}

}  // namespace llm::server
