// Mutex, its holders and a condition variable that clang's thread-safety
// analysis understands (util/thread_annotations.h): std::mutex with the
// attributes libstdc++ does not give it. Same cost as std::mutex: every
// member is an inline call of the one it wraps.
//
// There is deliberately no lock()/unlock(): std::lock_guard<Mutex> and
// std::unique_lock<Mutex> would compile and hold the lock unseen by the
// analysis. Hold one with MutexLock for a scope, or UniqueLock for a scope
// that lets it go early. A function that lets a lock go and takes it again
// inside (a load made without it) REQUIRES it, calls Unlock and Lock on the
// Mutex, and the analysis checks that it holds it again on every way out.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "util/thread_annotations.h"

namespace thindisk::util {

class TD_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() TD_ACQUIRE() { mu_.lock(); }
  void Unlock() TD_RELEASE() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` for its scope (std::lock_guard).
class TD_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) TD_ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() TD_RELEASE() { mu_.Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

// Holds `mu` from construction; Unlock and Lock let it go and take it
// again within the scope, and the destructor lets it go if held
// (std::unique_lock without moves: the analysis cannot follow a hold out
// of its scope). For code that must let go before the scope ends, e.g.
// before a call that may destroy the object the mutex belongs to.
class TD_SCOPED_CAPABILITY UniqueLock {
 public:
  explicit UniqueLock(Mutex& mu) TD_ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~UniqueLock() TD_RELEASE() {
    if (held_) mu_.Unlock();
  }
  UniqueLock(const UniqueLock&) = delete;
  UniqueLock& operator=(const UniqueLock&) = delete;

  void Lock() TD_ACQUIRE() {
    mu_.Lock();
    held_ = true;
  }
  void Unlock() TD_RELEASE() {
    held_ = false;
    mu_.Unlock();
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

// std::condition_variable on a util::Mutex. Wait with the mutex held (by
// any holder); it is let go while waiting and held again on return.
// Spurious wake-ups happen: wait in a loop on the condition, which the
// analysis then checks under the lock (a predicate lambda it would not).
class CondVar {
 public:
  void Wait(Mutex& mu) TD_REQUIRES(mu) {
    std::unique_lock<std::mutex> hold(mu.mu_, std::adopt_lock);
    cv_.wait(hold);
    hold.release();
  }
  // False when `deadline` passed without a notification.
  template <class Clock, class Duration>
  bool WaitUntil(Mutex& mu, std::chrono::time_point<Clock, Duration> deadline)
      TD_REQUIRES(mu) {
    std::unique_lock<std::mutex> hold(mu.mu_, std::adopt_lock);
    const std::cv_status st = cv_.wait_until(hold, deadline);
    hold.release();
    return st == std::cv_status::no_timeout;
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace thindisk::util
