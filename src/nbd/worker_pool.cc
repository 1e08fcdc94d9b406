#include "nbd/worker_pool.h"

#include <algorithm>

namespace thindisk::nbd {

WorkerPool::WorkerPool(size_t threads) {
  if (threads == 0) threads = kDefaultThreads;
  threads_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

WorkerPool::~WorkerPool() {
  {
    util::MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::Submit(std::function<void()> task) {
  {
    util::MutexLock lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.NotifyOne();
}

void WorkerPool::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      util::MutexLock lock(mu_);
      while (!stopping_ && tasks_.empty()) cv_.Wait(mu_);
      // Drain before stopping: a queued request still owes its client a reply.
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace thindisk::nbd
