// The OpenAI request mapping and the metrics text, without HTTP.
#include <doctest/doctest.h>

#include "server/api_error.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "test_util.h"

using namespace llm;
using namespace llm::server;

namespace {

struct Fixture {
  Fixture() : state(ServerConfig{}) {
    state.model = engine::Model::load(llm::test::model_path("stories260K"));
    state.tokenizer = std::make_unique<weights::Tokenizer>(state.model->checkpoint().load_tokenizer());
    state.chat_template = std::make_unique<weights::ChatTemplate>(weights::ChatTemplate::fallback());
    state.model_name = "stories260K";
  }
  // The ApiError a body produces (status and param), or a failed check.
  std::pair<int, std::string> error_of(const std::string& body, bool chat = true) {
    try {
      parse_completion_request(state, body, chat);
    } catch (const ApiError& e) {
      return {e.status, e.param.value_or("")};
    }
    FAIL("no error for " << body);
    return {0, ""};
  }
  AppState state;
};

}  // namespace

TEST_CASE_FIXTURE(Fixture, "a full chat request maps onto the engine request") {
  const auto r = parse_completion_request(state, R"({
    "model": "stories260K", "messages": [{"role": "developer", "content": "Be brief."},
                                          {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
    "max_completion_tokens": 12, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
    "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1, "seed": 7,
    "logit_bias": {"42": -100, "7": 2.5}, "logprobs": true, "top_logprobs": 3, "stop": ["\n\n", "END"],
    "stop_token_ids": [2], "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true},
    "user": "u1", "unknown_field": {"ignored": true}})",
                                          true);
  CHECK(r.chat);
  CHECK(r.stream);
  CHECK(r.include_usage);
  CHECK(r.logprobs);
  CHECK(r.top_logprobs == 3);
  CHECK(r.gen.max_tokens == 12);
  CHECK(r.gen.stop == std::vector<std::string>{"\n\n", "END"});
  CHECK(r.gen.stop_token_ids == std::vector<int32_t>{2});
  CHECK(r.gen.ignore_eos);
  const auto& s = r.gen.sampling;
  CHECK(s.temperature == 0.5f);
  CHECK(s.top_p == 0.9f);
  CHECK(s.top_k == 40);
  CHECK(s.min_p == 0.05f);
  CHECK(s.presence_penalty == 0.5f);
  CHECK(s.frequency_penalty == -0.5f);
  CHECK(s.repetition_penalty == doctest::Approx(1.1));
  CHECK(s.seed == 7u);
  CHECK(s.logit_bias.size() == 2);
  CHECK(s.n_top_logprobs == 3);
  // The fallback template renders "system: Be brief.\nuser: Hi\nassistant:" after BOS.
  const auto expected = state.tokenizer->encode("system: Be brief.\nuser: Hi\nassistant:", true);
  CHECK(r.gen.prompt == expected);
}

TEST_CASE_FIXTURE(Fixture, "completion prompts: string, one-string array, token ids; default max_tokens 16") {
  const auto a = parse_completion_request(state, R"({"prompt": "Once upon a time"})", false);
  CHECK(a.gen.prompt == std::vector<int32_t>{1, 403, 407, 261, 378});
  CHECK(a.gen.max_tokens == 16);
  CHECK(parse_completion_request(state, R"({"prompt": ["Once upon a time"]})", false).gen.prompt == a.gen.prompt);
  CHECK(parse_completion_request(state, R"({"prompt": [1, 403, 407]})", false).gen.prompt ==
        std::vector<int32_t>{1, 403, 407});
  CHECK(parse_completion_request(state, R"({"prompt": [[5, 6]]})", false).gen.prompt == std::vector<int32_t>{5, 6});
  // An empty prompt is unconditional generation: just BOS for this model.
  CHECK(parse_completion_request(state, R"({"prompt": ""})", false).gen.prompt == std::vector<int32_t>{1});
  const auto l = parse_completion_request(state, R"({"prompt": "x", "logprobs": 2})", false);
  CHECK(l.logprobs);
  CHECK(l.top_logprobs == 2);
  CHECK(parse_completion_request(state, R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 16.0})", true)
            .gen.max_tokens == 16);
}

TEST_CASE_FIXTURE(Fixture, "bad requests are 400s naming the field; an unknown model is a 404") {
  CHECK(error_of("{not json") == std::pair<int, std::string>{400, ""});
  CHECK(error_of("[1, 2]") == std::pair<int, std::string>{400, ""});
  CHECK(error_of(R"({"messages": "hi"})") == std::pair<int, std::string>{400, "messages"});
  CHECK(error_of(R"({})") == std::pair<int, std::string>{400, "messages"});
  CHECK(error_of(R"({"messages": []})") == std::pair<int, std::string>{400, "messages"});
  CHECK(error_of(R"({"messages": [{"role": "wizard", "content": "x"}]})") ==
        std::pair<int, std::string>{400, "messages[0].role"});
  CHECK(error_of(R"({"messages": [{"role": "user", "content": 5}]})") ==
        std::pair<int, std::string>{400, "messages[0].content"});
  const std::string ok = R"("messages": [{"role": "user", "content": "x"}])";
  CHECK(error_of("{" + ok + R"(, "max_tokens": "ten"})") == std::pair<int, std::string>{400, "max_tokens"});
  CHECK(error_of("{" + ok + R"(, "max_tokens": 0})") == std::pair<int, std::string>{400, "max_tokens"});
  CHECK(error_of("{" + ok + R"(, "temperature": "hot"})") == std::pair<int, std::string>{400, "temperature"});
  CHECK(error_of("{" + ok + R"(, "temperature": 3})") == std::pair<int, std::string>{400, "temperature"});
  CHECK(error_of("{" + ok + R"(, "n": 2})") == std::pair<int, std::string>{400, "n"});
  CHECK(error_of("{" + ok + R"(, "stream": "yes"})") == std::pair<int, std::string>{400, "stream"});
  CHECK(error_of("{" + ok + R"(, "stop": 5})") == std::pair<int, std::string>{400, "stop"});
  CHECK(error_of("{" + ok + R"(, "logit_bias": {"abc": 1}})") == std::pair<int, std::string>{400, "logit_bias"});
  CHECK(error_of("{" + ok + R"(, "logit_bias": {"99999": 1}})") == std::pair<int, std::string>{400, "logit_bias"});
  CHECK(error_of("{" + ok + R"(, "top_logprobs": 2})") == std::pair<int, std::string>{400, "top_logprobs"});
  CHECK(error_of("{" + ok + R"(, "model": "gpt-4"})") == std::pair<int, std::string>{404, "model"});
  CHECK(error_of(R"({"prompt": [1, 99999]})", false) == std::pair<int, std::string>{400, "prompt"});
  CHECK(error_of(R"({"prompt": {"a": 1}})", false) == std::pair<int, std::string>{400, "prompt"});
  CHECK(error_of(R"({"prompt": ["a", "b"]})", false) == std::pair<int, std::string>{400, "prompt"});
}

TEST_CASE("errors serialise in the OpenAI shape") {
  const auto j = nlohmann::json::parse(ApiError(429, "rate_limit_error", "busy", std::nullopt, "queue_full").to_json());
  CHECK(j["error"]["message"] == "busy");
  CHECK(j["error"]["type"] == "rate_limit_error");
  CHECK(j["error"]["param"].is_null());
  CHECK(j["error"]["code"] == "queue_full");
}

TEST_CASE("metrics: counters and cumulative histogram buckets in Prometheus text") {
  Metrics m;
  m.count_request("/v1/completions", 200);
  m.count_request("/v1/completions", 200);
  m.count_request("/v1/completions", 400);
  m.add_tokens(10, 5);
  m.observe_ttft(0.02);
  m.observe_ttft(0.3);
  m.observe_ttft(100.0);
  const std::string text = m.render(nullptr);
  CHECK(text.find("llm_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2\n") != std::string::npos);
  CHECK(text.find("llm_requests_total{endpoint=\"/v1/completions\",status=\"400\"} 1\n") != std::string::npos);
  CHECK(text.find("llm_prompt_tokens_total 10\n") != std::string::npos);
  CHECK(text.find("llm_generation_tokens_total 5\n") != std::string::npos);
  CHECK(text.find("llm_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n") != std::string::npos);
  CHECK(text.find("llm_time_to_first_token_seconds_bucket{le=\"0.5\"} 2\n") != std::string::npos);
  CHECK(text.find("llm_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n") != std::string::npos);
  CHECK(text.find("llm_time_to_first_token_seconds_count 3\n") != std::string::npos);
  CHECK(text.find("llm_requests_running 0\n") != std::string::npos);
  CHECK(text.find("# TYPE llm_time_per_output_token_seconds histogram\n") != std::string::npos);
}
