#pragma once
// A persistent pool for the engine's parallel loops. Threads are created
// once; each parallel_for splits [0, n) into contiguous chunks, one per
// thread, with the caller taking the first. A forward pass hands work over
// hundreds of times per token, so idle workers spin briefly before sleeping:
// a hand-off then costs well under a microsecond instead of a futex wake-up.
#include <atomic>
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

  // Runs fn(begin, end) over disjoint chunks covering [0, n); returns when all
  // are done. One parallel_for at a time per pool (the engine thread's).
  template <typename Fn>
  void parallel_for(int64_t n, Fn&& fn) {
    run(n, [](void* ctx, int64_t b, int64_t e) { (*static_cast<Fn*>(ctx))(b, e); }, &fn);
  }

 private:
  using Task = void (*)(void* ctx, int64_t begin, int64_t end);
  void run(int64_t n, Task task, void* ctx);
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  // Published with generation_ (release) and read after seeing it (acquire).
  Task task_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> n_pending_{0};
  std::atomic<bool> stopping_{false};
  // Sleeping workers wait here; n_sleeping_ tells the caller whether to notify.
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<int> n_sleeping_{0};
};

}  // namespace llm::engine
