#include "engine/thread_pool.h"

#include <algorithm>

namespace llm::engine {

ThreadPool::ThreadPool(int n_threads) {
  const int n_workers = std::max(0, n_threads - 1);
  workers_.reserve(static_cast<size_t>(n_workers));
  for (int i = 0; i < n_workers; ++i) workers_.emplace_back([this, i] { worker_loop(i + 1); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

namespace {
// Chunk `index` of `n_chunks` over [0, n): sizes differ by at most one.
std::pair<int64_t, int64_t> chunk(int64_t n, int index, int n_chunks) {
  const int64_t base = n / n_chunks, extra = n % n_chunks;
  const int64_t begin = index * base + std::min<int64_t>(index, extra);
  return {begin, begin + base + (index < extra ? 1 : 0)};
}
}  // namespace

void ThreadPool::run(int64_t n, Task task, void* ctx) {
  if (n <= 0) return;
  const int n_chunks = static_cast<int>(std::min<int64_t>(n, n_threads()));
  if (n_chunks == 1) {
    task(ctx, 0, n);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    task_ = task;
    ctx_ = ctx;
    n_ = n;
    n_pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  const auto [b, e] = chunk(n, 0, n_threads());
  task(ctx, b, e);
  std::unique_lock lock(mutex_);
  done_.wait(lock, [this] { return n_pending_ == 0; });
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    Task task;
    void* ctx;
    int64_t n;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      task = task_;
      ctx = ctx_;
      n = n_;
    }
    const auto [b, e] = chunk(n, index, n_threads());
    if (b < e) task(ctx, b, e);
    {
      std::lock_guard lock(mutex_);
      if (--n_pending_ == 0) done_.notify_one();
    }
  }
}

}  // namespace llm::engine
