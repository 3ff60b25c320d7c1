#pragma once
// The engine facade the server talks to: submit(request, on_event) and
// cancel(id). A scheduler thread serves up to n_parallel sequences at once,
// each in its own slot (KV cache), one step per slot per round: a prompt
// chunk of at most prefill_chunk tokens, or one decode token. A long prompt
// therefore never stalls the streams already running for longer than one chunk.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "engine/generation.h"
#include "engine/model.h"
#include "weights/tokenizer.h"

namespace llm::engine {

struct EngineOptions {
  int n_threads = 0;            // 0: all cores
  int n_parallel = 4;           // sequences generated at a time
  int64_t n_ctx = 4096;         // context per sequence
  int64_t max_queue = 64;       // requests waiting for a slot; more are refused
  int64_t prefill_chunk = 256;  // prompt tokens per scheduler step
};

using RequestId = uint64_t;

struct EngineEvent {
  enum class Kind { token, done } kind = Kind::token;
  TokenEvent token;         // Kind::token
  GenerationResult result;  // Kind::done: always the last event of a request
};
// Called on the engine thread: it must return quickly (post work elsewhere).
using EventCallback = std::function<void(EngineEvent&&)>;

enum class SubmitStatus { accepted, queue_full, shutting_down };

struct EngineStats {
  int64_t n_running = 0;
  int64_t n_queued = 0;
  int64_t n_parallel = 0;
  int64_t kv_tokens_used = 0;   // filled positions over all slots
  int64_t kv_tokens_total = 0;  // n_parallel * n_ctx
};

class Engine {
 public:
  Engine(std::shared_ptr<const Model> model, const weights::Tokenizer& tokenizer, EngineOptions options);
  ~Engine();  // cancels whatever still runs, then joins the scheduler
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates the request (throws RequestError) and queues it. The callback
  // receives token events and finally one done event, unless the request is
  // not accepted, in which case it is never called.
  std::pair<SubmitStatus, RequestId> submit(GenerationRequest request, EventCallback on_event);
  // Ends a queued or running request; its done event reports FinishReason::cancelled.
  void cancel(RequestId id);
  // Stops accepting requests, lets running and queued ones finish until the
  // deadline, then cancels the rest. Returns once all are done.
  void shutdown(std::chrono::milliseconds deadline);

  EngineStats stats() const;
  const EngineOptions& options() const { return options_; }
  const Model& model() const { return *model_; }

 private:
  struct Slot;
  struct Pending {
    RequestId id;
    GenerationRequest request;
    EventCallback on_event;
  };

  void run();
  bool step(Slot& slot);  // one unit of work; true when the slot's sequence finished
  // Frees the slot; returns its callback and final event to deliver.
  std::pair<EventCallback, EngineEvent> release(Slot& slot);

  std::shared_ptr<const Model> model_;
  const weights::Tokenizer* tokenizer_;
  EngineOptions options_;
  std::unique_ptr<ForwardContext> ctx_;
  std::vector<std::unique_ptr<Slot>> slots_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<Pending> queue_;
  std::vector<RequestId> cancelled_;  // ids to cancel, read by the scheduler
  RequestId next_id_ = 1;
  bool accepting_ = true;
  bool stopping_ = false;
  int64_t n_running_ = 0;
  std::vector<int64_t> slot_positions_;  // KV positions used per slot, for stats
  std::thread thread_;
};

}  // namespace llm::engine
