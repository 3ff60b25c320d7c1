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

// Chunk `index` of `n_chunks` over [0, n): sizes differ by at most one.
std::pair<int64_t, int64_t> chunk(int64_t n, int index, int n_chunks) {
  const int64_t base = n / n_chunks, extra = n % n_chunks;
  const int64_t begin = index * base + std::min<int64_t>(index, extra);
  return {begin, begin + base + (index < extra ? 1 : 0)};
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  const int n_workers = std::max(0, n_threads - 1);
  workers_.reserve(static_cast<size_t>(n_workers));
  for (int i = 0; i < n_workers; ++i) workers_.emplace_back([this, i] { worker_loop(i + 1); });
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
  if (workers_.empty() || n == 1) {
    task(ctx, 0, n);
    return;
  }
  task_ = task;
  ctx_ = ctx;
  n_ = n;
  n_pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  if (n_sleeping_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard lock(mutex_);  // pairs with the worker's check under the lock
    wake_.notify_all();
  }
  const auto [b, e] = chunk(n, 0, n_threads());
  if (b < e) task(ctx, b, e);
  for (int spins = 0; n_pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < k_spin_iterations) {
      LLM_PAUSE();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen && !stopping_.load(std::memory_order_relaxed)) {
      if (++spins < k_spin_iterations) {
        LLM_PAUSE();
        continue;
      }
      std::unique_lock lock(mutex_);
      n_sleeping_.fetch_add(1, std::memory_order_seq_cst);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen || stopping_.load(); });
      n_sleeping_.fetch_sub(1, std::memory_order_relaxed);
      spins = 0;
    }
    if (stopping_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    const auto [b, e] = chunk(n_, index, n_threads());
    if (b < e) task_(ctx_, b, e);
    n_pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace llm::engine
