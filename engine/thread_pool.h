#pragma once
// A persistent pool for the loops BLAS does not cover (attention, norms).
// Threads are created once; each parallel_for splits [0, n) into contiguous
// chunks, one per thread, with the caller taking the first.
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace llm::engine {

class ThreadPool {
 public:
  // n_threads counts the caller: 1 means no worker threads.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(begin, end) over disjoint chunks covering [0, n); returns when all are done.
  // Not reentrant: one parallel_for at a time per pool.
  template <typename Fn>
  void parallel_for(int64_t n, Fn&& fn) {
    run(n, [](void* ctx, int64_t b, int64_t e) { (*static_cast<Fn*>(ctx))(b, e); }, &fn);
  }

 private:
  using Task = void (*)(void* ctx, int64_t begin, int64_t end);
  void run(int64_t n, Task task, void* ctx);
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  uint64_t generation_ = 0;
  int n_pending_ = 0;
  bool stopping_ = false;
  Task task_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
};

}  // namespace llm::engine
