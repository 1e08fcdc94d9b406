// WorkerPool: a fixed set of threads running submitted tasks in FIFO order.
//
// The NBD server executes requests from every connection on one pool sized
// to the machine, so a busy connection cannot starve the others of threads
// and the thread count does not grow with clients.
//
// Thread safety: Submit may be called from any thread. The destructor runs
// every task already submitted, then joins the threads.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace thindisk::nbd {

class WorkerPool {
 public:
  // threads == 0: std::thread::hardware_concurrency() (at least 2).
  explicit WorkerPool(size_t threads = 0);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void Submit(std::function<void()> task);
  size_t size() const { return threads_.size(); }

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace thindisk::nbd
