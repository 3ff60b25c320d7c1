#include "engine/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define LLM_PAUSE() _mm_pause()
#else
#define LLM_PAUSE() std::this_thread::yield()
#endif

namespace llm::engine {

namespace {

// About 50-100 µs of spinning before a worker sleeps: longer than the gaps
// between hand-offs inside a forward pass, short enough not to burn a core
// between requests.
constexpr int k_spin_iterations = 20000;
// Chunks per thread: small enough shares that the caller can pick up the
// work of a worker that starts late.
constexpr int64_t k_chunks_per_thread = 4;

uint32_t generation_of(uint64_t state) { return static_cast<uint32_t>(state >> 32); }

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  const int n_workers = std::max(0, n_threads - 1);
  workers_.reserve(static_cast<size_t>(n_workers));
  for (int i = 0; i < n_workers; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_.store(true);
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::run(int64_t n, Task task, void* ctx) {
  if (n <= 0) return;
  const auto n_chunks = static_cast<uint32_t>(std::min<int64_t>(n, n_threads() * k_chunks_per_thread));
  if (workers_.empty() || n_chunks == 1) {
    task(ctx, 0, n);
    return;
  }
  task_.store(task, std::memory_order_relaxed);
  ctx_.store(ctx, std::memory_order_relaxed);
  n_.store(n, std::memory_order_relaxed);
  n_chunks_.store(n_chunks, std::memory_order_relaxed);
  n_done_.store(0, std::memory_order_relaxed);
  const uint32_t generation = generation_of(state_.load(std::memory_order_relaxed)) + 1;
  state_.store(static_cast<uint64_t>(generation) << 32, std::memory_order_seq_cst);  // publishes the above
  if (n_sleeping_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard lock(mutex_);  // pairs with the worker's check under the lock
    wake_.notify_all();
  }
  work_on(generation);
  // Every chunk is claimed now; wait for those other threads are running.
  for (int spins = 0; n_done_.load(std::memory_order_acquire) != n_chunks; ++spins) {
    if (spins < k_spin_iterations) {
      LLM_PAUSE();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::work_on(uint32_t generation) {
  uint64_t s = state_.load(std::memory_order_acquire);
  for (;;) {
    if (generation_of(s) != generation) return;
    const auto index = static_cast<uint32_t>(s);
    const uint32_t n_chunks = n_chunks_.load(std::memory_order_relaxed);
    if (index >= n_chunks) return;
    // Read the task before claiming: a successful claim proves this generation
    // is still running, so these values are its own.
    const Task task = task_.load(std::memory_order_relaxed);
    void* const ctx = ctx_.load(std::memory_order_relaxed);
    const int64_t n = n_.load(std::memory_order_relaxed);
    if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    const int64_t base = n / n_chunks, extra = n % n_chunks;
    const int64_t begin = index * base + std::min<int64_t>(index, extra);
    const int64_t end = begin + base + (index < extra ? 1 : 0);
    task(ctx, begin, end);
    n_done_.fetch_add(1, std::memory_order_release);
    s = state_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_loop() {
  uint32_t seen = 0;
  for (;;) {
    int spins = 0;
    while (generation_of(state_.load(std::memory_order_acquire)) == seen && !stopping_.load(std::memory_order_relaxed)) {
      if (++spins < k_spin_iterations) {
        LLM_PAUSE();
        continue;
      }
      std::unique_lock lock(mutex_);
      n_sleeping_.fetch_add(1, std::memory_order_seq_cst);
      wake_.wait(lock, [&] {
        return generation_of(state_.load(std::memory_order_seq_cst)) != seen || stopping_.load();
      });
      n_sleeping_.fetch_sub(1, std::memory_order_relaxed);
      spins = 0;
    }
    if (stopping_.load()) return;
    seen = generation_of(state_.load(std::memory_order_acquire));
    work_on(seen);
  }
}

}  // namespace llm::engine
