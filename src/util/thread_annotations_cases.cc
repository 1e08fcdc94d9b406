// Cases for thread_annotations_test.sh, which compiles this file once per
// CASE with clang's -Wthread-safety -Werror (syntax only; no build target
// compiles it). CASE 0 is the contract kept, and must compile; every other
// case breaks it once, and must be rejected with the diagnostic the script
// names for it.
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace {

using thindisk::util::CondVar;
using thindisk::util::Mutex;
using thindisk::util::MutexLock;
using thindisk::util::UniqueLock;

class Counter {
 public:
  void Add() {
    MutexLock lock(mu_);
    AddLocked();
    changed_.NotifyAll();
  }

  int WaitPositive() {
    MutexLock lock(mu_);
    while (n_ <= 0) changed_.Wait(mu_);
    return n_;
  }

  // Lets the lock go before the scope ends (before a call that may
  // destroy what holds the mutex, say).
  int AddThenLetGo() {
    UniqueLock lock(mu_);
    AddLocked();
    const int n = n_;
    lock.Unlock();
#if CASE == 6
    ++n_;  // after the early Unlock
#endif
    return n;
  }

  // Lets the lock go for slow work and takes it again before returning.
  void AddAfterSlowWork() TD_REQUIRES(mu_) {
    mu_.Unlock();
    const int slow = 1;
    mu_.Lock();
    n_ += slow;
  }

#if CASE == 1
  int Peek() { return n_; }  // unlocked read
#elif CASE == 2
  void AddUnlocked() { AddLocked(); }  // REQUIRES not met
#elif CASE == 3
  int Early(bool give_up) TD_REQUIRES(mu_) {
    mu_.Unlock();
    if (give_up) return 0;  // leaves without the lock the caller counts on
    mu_.Lock();
    return 1;
  }
#elif CASE == 4
  void AfterScope() {
    { MutexLock lock(mu_); }
    ++n_;  // the scope that held the lock has ended
  }
#elif CASE == 5
  void Unseen() {
    std::lock_guard<Mutex> lock(mu_);  // no lock(): holders the analysis cannot see
  }
#endif

 private:
  void AddLocked() TD_REQUIRES(mu_) { ++n_; }

  Mutex mu_;
  CondVar changed_;
  int n_ TD_GUARDED_BY(mu_) = 0;
};

}  // namespace

int main() {
  Counter c;
  c.Add();
  return c.WaitPositive() == 1 ? 0 : 1;
}
