// The Engine facade: concurrent requests over few slots give the same output
// as running alone; cancellation frees the slot; the queue is bounded;
// shutdown drains or cancels.
#include <doctest/doctest.h>

#include <condition_variable>
#include <future>
#include <mutex>

#include "engine/engine.h"
#include "engine/generator.h"
#include "test_util.h"

using namespace llm;
using namespace std::chrono_literals;

namespace {

struct Collector {
  std::mutex mutex;
  std::condition_variable cv;
  std::string text;
  std::vector<int32_t> ids;
  std::optional<engine::GenerationResult> result;

  engine::EventCallback callback() {
    return [this](engine::EngineEvent&& e) {
      std::lock_guard lock(mutex);
      if (e.kind == engine::EngineEvent::Kind::token) {
        text += e.token.text;
        if (e.token.id >= 0) ids.push_back(e.token.id);
      } else {
        result = std::move(e.result);
        cv.notify_all();
      }
    };
  }
  engine::GenerationResult wait() {
    std::unique_lock lock(mutex);
    if (!cv.wait_for(lock, 60s, [&] { return result.has_value(); })) throw std::runtime_error("request never finished");
    return *result;
  }
};

struct Fixture {
  std::shared_ptr<const engine::Model> model = engine::Model::load(llm::test::model_path("stories260K"));
  weights::Tokenizer tokenizer = model->checkpoint().load_tokenizer();

  engine::GenerationRequest request(const std::string& prompt, int32_t n) const {
    engine::GenerationRequest r;
    r.prompt = tokenizer.encode(prompt, true);
    r.sampling.temperature = 0.0f;
    r.max_tokens = n;
    r.ignore_eos = true;
    return r;
  }
};

}  // namespace

TEST_CASE_FIXTURE(Fixture, "eight concurrent requests on two slots match their solo outputs") {
  const std::vector<std::string> prompts = {"Once upon a time", "The cat", "Lily and Tom went", "One day",
                                            "The sun was", "A little dog", "Mom said", "They played"};
  engine::Generator solo(model, tokenizer, 1, 512);
  std::vector<engine::GenerationResult> expected;
  for (const auto& p : prompts) expected.push_back(solo.generate(request(p, 30), {}));

  engine::Engine eng(model, tokenizer, engine::EngineOptions{.n_threads = 2, .n_parallel = 2, .n_ctx = 512,
                                                            .max_queue = 16, .prefill_chunk = 3});
  std::vector<std::unique_ptr<Collector>> out;
  for (const auto& p : prompts) {
    out.push_back(std::make_unique<Collector>());
    const auto [status, id] = eng.submit(request(p, 30), out.back()->callback());
    CHECK(status == engine::SubmitStatus::accepted);
    CHECK(id > 0);
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto r = out[i]->wait();
    CHECK(r.finish == engine::FinishReason::length);
    CHECK(r.tokens == expected[i].tokens);
    CHECK(out[i]->text == expected[i].text);
    CHECK(out[i]->ids == expected[i].tokens);
  }
  const auto st = eng.stats();
  CHECK(st.n_running == 0);
  CHECK(st.n_queued == 0);
  CHECK(st.kv_tokens_used == 0);
}

TEST_CASE_FIXTURE(Fixture, "cancelling a running request frees its slot for the next one") {
  engine::Engine eng(model, tokenizer, engine::EngineOptions{.n_threads = 1, .n_parallel = 1, .n_ctx = 512});
  Collector first, second;
  std::promise<void> started;
  bool signalled = false;
  auto cb = first.callback();
  const auto [s1, id1] = eng.submit(request("Once upon a time", 400), [&](engine::EngineEvent&& e) {
    if (!signalled && e.kind == engine::EngineEvent::Kind::token) {
      signalled = true;
      started.set_value();
    }
    cb(std::move(e));
  });
  REQUIRE(s1 == engine::SubmitStatus::accepted);
  const auto [s2, id2] = eng.submit(request("The cat", 5), second.callback());
  REQUIRE(s2 == engine::SubmitStatus::accepted);
  started.get_future().wait();
  CHECK(eng.stats().n_running == 1);
  CHECK(eng.stats().n_queued == 1);
  eng.cancel(id1);
  const auto r1 = first.wait();
  CHECK(r1.finish == engine::FinishReason::cancelled);
  CHECK(r1.n_generated_tokens < 400);
  const auto r2 = second.wait();
  CHECK(r2.finish == engine::FinishReason::length);
  CHECK(r2.n_generated_tokens == 5);
  eng.cancel(id2);  // already finished: harmless
  eng.cancel(12345);
}

TEST_CASE_FIXTURE(Fixture, "the admission queue is bounded; bad requests throw before queueing") {
  engine::Engine eng(model, tokenizer, engine::EngineOptions{.n_threads = 1, .n_parallel = 1, .n_ctx = 512,
                                                            .max_queue = 2});
  std::vector<std::unique_ptr<Collector>> out;
  int n_accepted = 0, n_full = 0;
  std::vector<engine::RequestId> ids;
  for (int i = 0; i < 6; ++i) {
    out.push_back(std::make_unique<Collector>());
    const auto [status, id] = eng.submit(request("Once upon a time", 300), out.back()->callback());
    if (status == engine::SubmitStatus::accepted) {
      ++n_accepted;
      ids.push_back(id);
    } else {
      CHECK(status == engine::SubmitStatus::queue_full);
      ++n_full;
      out.pop_back();
    }
  }
  CHECK(n_accepted == 3);  // one running (or about to) and two waiting
  CHECK(n_full == 3);
  for (auto id : ids) eng.cancel(id);
  for (auto& c : out) CHECK(c->wait().finish == engine::FinishReason::cancelled);

  engine::GenerationRequest bad = request("x", 10);
  bad.prompt.assign(600, 5);
  CHECK_THROWS_AS(eng.submit(bad, [](engine::EngineEvent&&) {}), engine::RequestError);
}

TEST_CASE_FIXTURE(Fixture, "shutdown lets short requests finish, cancels long ones at the deadline, refuses new ones") {
  engine::Engine eng(model, tokenizer, engine::EngineOptions{.n_threads = 1, .n_parallel = 2, .n_ctx = 512});
  Collector quick, slow;
  eng.submit(request("The cat", 5), quick.callback());
  auto slow_req = request("Once upon a time", 500);
  slow_req.max_tokens = 500;
  // Slow the long stream so it cannot finish before the deadline.
  auto slow_cb = slow.callback();
  eng.submit(slow_req, [&](engine::EngineEvent&& e) {
    if (e.kind == engine::EngineEvent::Kind::token) std::this_thread::sleep_for(5ms);
    slow_cb(std::move(e));
  });
  eng.shutdown(300ms);
  CHECK(quick.wait().finish == engine::FinishReason::length);
  CHECK(slow.wait().finish == engine::FinishReason::cancelled);
  CHECK(eng.submit(request("x", 2), [](engine::EngineEvent&&) {}).first == engine::SubmitStatus::shutting_down);
}
