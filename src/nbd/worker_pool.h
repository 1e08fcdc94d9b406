// WorkerPool: a fixed set of threads running submitted tasks in FIFO order.
//
// The NBD server executes requests from every connection on one pool, so a
// busy connection cannot starve the others of threads and the thread count
// does not grow with clients. The pool's size is the number of requests the
// server has in flight against its storage, so the default is set by what
// storage needs (many requests outstanding: a disk's queue, a network
// store's latency) and what memory allows (docs/serve-limits.md: 4 MiB per
// worker at most), not by the CPU count: workers mostly wait for I/O, and
// an idle one sleeps on a condition variable.
//
// Thread safety: Submit may be called from any thread. The destructor runs
// every task already submitted, then joins the threads.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace thindisk::nbd {

class WorkerPool {
 public:
  // Requests in flight by default. bench/compare, 2026-12-01 (one run
  // each): W9 (cold 4 KiB random reads, 4 connections x QD8) 15.6-16.3k
  // IOPS with the former one worker per CPU (2 here), 22.2k with 8,
  // 19.4-22.4k with 16; W7 (cold 1 MiB sequential reads at QD16) 1003-1177
  // MB/s with 2, 974-1037 with 8, 784-967 with 16: more parallel 1 MiB
  // reads of one file start to defeat the kernel's readahead.
  static constexpr size_t kDefaultThreads = 8;

  // threads == 0: kDefaultThreads.
  explicit WorkerPool(size_t threads = 0);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void Submit(std::function<void()> task);
  size_t size() const { return threads_.size(); }

 private:
  void Loop();

  util::Mutex mu_;
  util::CondVar cv_;
  std::deque<std::function<void()>> tasks_ TD_GUARDED_BY(mu_);
  bool stopping_ TD_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace thindisk::nbd
