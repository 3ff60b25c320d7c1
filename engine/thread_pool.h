#pragma once
// A persistent pool for the engine's parallel loops. Threads are created
// once. Each parallel_for splits [0, n) into contiguous chunks that threads
// claim from one atomic counter; the caller claims chunks too, so a worker
// that the OS has not scheduled (a busy machine) delays nothing: whatever it
// has not claimed, the caller runs. Idle workers spin briefly before sleeping,
// since a forward pass hands work over hundreds of times per token.
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
  void work_on(uint32_t generation);  // claims and runs chunks of that generation
  void worker_loop();

  std::vector<std::thread> workers_;
  // generation << 32 | index of the next unclaimed chunk. A new generation is
  // published only after every chunk of the previous one has finished.
  std::atomic<uint64_t> state_{0};
  std::atomic<Task> task_{nullptr};
  std::atomic<void*> ctx_{nullptr};
  std::atomic<int64_t> n_{0};
  std::atomic<uint32_t> n_chunks_{0};
  std::atomic<uint32_t> n_done_{0};
  std::atomic<bool> stopping_{false};
  // Sleeping workers wait here; n_sleeping_ tells the caller whether to notify.
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<int> n_sleeping_{0};
};

}  // namespace llm::engine
