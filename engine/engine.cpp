#include "engine/engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "engine/kv_cache.h"
#include "engine/sequence.h"

namespace llm::engine {

struct Engine::Slot {
  Slot(const weights::ModelConfig& config, int64_t n_ctx) : cache(config, n_ctx) {}
  KvCache cache;
  RequestId id = 0;
  std::optional<Sequence> seq;
  EventCallback on_event;
};

Engine::Engine(std::shared_ptr<const Model> model, const weights::Tokenizer& tokenizer, EngineOptions options)
    : model_(std::move(model)), tokenizer_(&tokenizer), options_(options) {
  if (options_.n_parallel <= 0) throw std::invalid_argument("n_parallel must be positive");
  if (options_.n_ctx <= 1) throw std::invalid_argument("the context must hold at least two tokens");
  if (options_.max_queue < 0) throw std::invalid_argument("max_queue must not be negative");
  if (options_.prefill_chunk <= 0) throw std::invalid_argument("prefill_chunk must be positive");
  ctx_ = std::make_unique<ForwardContext>(*model_, options_.n_threads, options_.prefill_chunk);
  for (int i = 0; i < options_.n_parallel; ++i) slots_.push_back(std::make_unique<Slot>(model_->config(), options_.n_ctx));
  slot_positions_.assign(slots_.size(), 0);
  thread_ = std::thread([this] { run(); });
}

Engine::~Engine() {
  {
    std::lock_guard lock(mutex_);
    accepting_ = false;
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::pair<SubmitStatus, RequestId> Engine::submit(GenerationRequest request, EventCallback on_event) {
  validate_request(request, model_->config().n_vocab, options_.n_ctx);
  std::lock_guard lock(mutex_);
  if (!accepting_) return {SubmitStatus::shutting_down, 0};
  // A request waits only if every slot is busy; the queue bounds how many may wait.
  const auto n_free = static_cast<int64_t>(slots_.size()) - n_running_;
  if (static_cast<int64_t>(queue_.size()) >= options_.max_queue + std::max<int64_t>(n_free, 0)) {
    return {SubmitStatus::queue_full, 0};
  }
  const RequestId id = next_id_++;
  queue_.push_back(Pending{id, std::move(request), std::move(on_event)});
  wake_.notify_one();
  return {SubmitStatus::accepted, id};
}

void Engine::cancel(RequestId id) {
  std::lock_guard lock(mutex_);
  cancelled_.push_back(id);
  wake_.notify_one();
}

void Engine::shutdown(std::chrono::milliseconds deadline) {
  std::unique_lock lock(mutex_);
  accepting_ = false;
  const bool drained = idle_.wait_for(lock, deadline, [&] { return queue_.empty() && n_running_ == 0; });
  if (!drained) {
    spdlog::warn("engine: shutdown deadline reached; cancelling {} running and {} queued requests", n_running_,
                 queue_.size());
    for (const Pending& p : queue_) cancelled_.push_back(p.id);
    for (const auto& slot : slots_) {
      if (slot->seq) cancelled_.push_back(slot->id);
    }
    wake_.notify_one();
    idle_.wait(lock, [&] { return queue_.empty() && n_running_ == 0; });
  }
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mutex_);
  EngineStats s;
  s.n_running = n_running_;
  s.n_queued = static_cast<int64_t>(queue_.size());
  s.n_parallel = static_cast<int64_t>(slots_.size());
  for (int64_t p : slot_positions_) s.kv_tokens_used += p;
  s.kv_tokens_total = s.n_parallel * options_.n_ctx;
  return s;
}

std::pair<EventCallback, EngineEvent> Engine::release(Slot& slot) {
  EngineEvent done;
  done.kind = EngineEvent::Kind::done;
  done.result = std::move(slot.seq->result());
  EventCallback cb = std::move(slot.on_event);
  slot.seq.reset();
  slot.id = 0;
  return {std::move(cb), std::move(done)};
}

bool Engine::step(Slot& slot) {
  Sequence& seq = *slot.seq;
  auto on_token = [&](const TokenEvent& ev) {
    EngineEvent e;
    e.token = ev;
    slot.on_event(std::move(e));
  };
  if (seq.prefilling()) {
    const auto chunk = seq.next_prefill_chunk(options_.prefill_chunk);
    if (model_->forward(chunk, slot.cache, *ctx_) != Status::ok) {
      seq.finish(FinishReason::length);  // validated up front, so this is not expected
      return true;
    }
    seq.prefilled(static_cast<int64_t>(chunk.size()));
    if (seq.prefilling()) return false;
  } else {
    const int32_t next = seq.last_token();
    if (model_->forward(std::span<const int32_t>(&next, 1), slot.cache, *ctx_) != Status::ok) {
      seq.finish(FinishReason::length);
      return true;
    }
  }
  return seq.accept_logits(ctx_->logits_row(0), slot.cache.n_past(), on_token);
}

void Engine::run() {
  const int64_t n_vocab = model_->config().n_vocab;
  for (;;) {
    std::vector<RequestId> cancelled;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || n_running_ > 0 || !cancelled_.empty(); });
      cancelled.swap(cancelled_);
      if (stopping_) {
        for (const Pending& p : queue_) cancelled.push_back(p.id);
        for (const auto& slot : slots_) {
          if (slot->seq) cancelled.push_back(slot->id);
        }
      }
      // Queued requests cancelled before they started end here.
      for (auto it = queue_.begin(); it != queue_.end();) {
        if (std::find(cancelled.begin(), cancelled.end(), it->id) != cancelled.end()) {
          EngineEvent done;
          done.kind = EngineEvent::Kind::done;
          done.result.finish = FinishReason::cancelled;
          done.result.n_prompt_tokens = static_cast<int32_t>(it->request.prompt.size());
          EventCallback cb = std::move(it->on_event);
          it = queue_.erase(it);
          lock.unlock();
          cb(std::move(done));
          lock.lock();
        } else {
          ++it;
        }
      }
      // First come, first served into free slots.
      for (auto& slot : slots_) {
        if (slot->seq || queue_.empty()) continue;
        Pending p = std::move(queue_.front());
        queue_.pop_front();
        slot->cache.clear();
        slot->id = p.id;
        slot->on_event = std::move(p.on_event);
        slot->seq.emplace(std::move(p.request), *tokenizer_, n_vocab, options_.n_ctx);
        ++n_running_;
      }
      if (stopping_ && n_running_ == 0 && queue_.empty()) {
        idle_.notify_all();
        return;
      }
    }
    // One step per running slot, outside the lock.
    for (size_t i = 0; i < slots_.size(); ++i) {
      Slot& slot = *slots_[i];
      if (!slot.seq) continue;
      bool done;
      if (std::find(cancelled.begin(), cancelled.end(), slot.id) != cancelled.end()) {
        slot.seq->finish(FinishReason::cancelled);
        done = true;
      } else {
        done = step(slot);
      }
      if (!done) {
        std::lock_guard lock(mutex_);
        slot_positions_[i] = slot.cache.n_past();
        continue;
      }
      // The slot is free and the stats say so before the client hears "done";
      // idle is signalled only after, so shutdown waits for the last event.
      auto [callback, event] = release(slot);
      {
        std::lock_guard lock(mutex_);
        slot_positions_[i] = 0;
        --n_running_;
      }
      callback(std::move(event));  // may call into the engine: not under the lock
      std::lock_guard lock(mutex_);
      if (n_running_ == 0 && queue_.empty()) idle_.notify_all();
    }
  }
}

}  // namespace llm::engine
