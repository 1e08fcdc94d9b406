// BusyPoll: a connection's reader spins briefly for the client's next
// request before it blocks in poll(2).
//
// Why: a client at a low queue depth sends its next request a few
// microseconds after it reads a reply. A reader that blocks in poll() for
// it lets its CPU go idle, and waking an idle CPU is slow where the CPU is
// virtual (a halted vCPU waits for the host to run it again: 45 us and more
// on the machine of docs/performance.md, where the next request arrives in
// 14-19 us). Spinning for up to a set time (qemu's event loop does the same
// with its poll-max-ns; Linux sockets with SO_BUSY_POLL) keeps the CPU busy
// across that gap.
//
// What it costs is CPU while nothing comes, so a connection stops spinning
// when its spins mostly fail (a client that thinks between requests, or
// waits for a slow reply) and tries again now and then; and at most
// `Slots::limit` readers of a server spin at once, so spinning never takes
// every CPU from the clients and workers beside it.
//
// Thread safety: a BusyPoll belongs to one connection's reader thread;
// Slots is shared by every connection of a server.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace thindisk::nbd {

class BusyPoll {
 public:
  // How many readers may spin at once: one fewer than the CPUs (at least
  // one), so one CPU at least is left to everything else.
  struct Slots {
    explicit Slots(int limit) : limit(limit) {}
    static int DefaultLimit();
    const int limit;
    std::atomic<int> spinning{0};
    // Spins that ended with the request there, and spins that ran out.
    std::atomic<uint64_t> hits{0};
    std::atomic<uint64_t> misses{0};
  };

  // 50 us: at QD1 on the machine of docs/performance.md the next request
  // comes 14-19 us after a reply; a client's wake-up from an idle vCPU
  // takes about 45 us.
  static constexpr std::chrono::microseconds kDefaultBudget{50};

  // Credits a connection starts with, gains per spin that ended with the
  // request there (kGain) and loses per spin that ran out (1): spinning
  // goes on while at least one spin in kGain + 1 succeeds.
  static constexpr int kMaxCredits = 16;
  static constexpr int kGain = 2;
  // With no credit left, every kProbeEvery-th wait spins again, so a
  // client that speeds up is noticed.
  static constexpr int kProbeEvery = 32;

  // budget 0: never spins. slots == nullptr: no limit across connections
  // (and no counters).
  BusyPoll(std::chrono::microseconds budget, Slots* slots)
      : budget_(budget), slots_(slots) {}

  // Calls `ready` (which must not block) until it returns true or the
  // budget runs out, giving the CPU to anyone runnable between calls.
  // Returns true when `ready` did. Returns false at once, without calling
  // it, when this connection has no credit or the server's slots are
  // taken.
  template <class Ready>
  bool Spin(Ready&& ready) {
    if (!Admit()) return false;
    const auto until = std::chrono::steady_clock::now() + budget_;
    bool got = false;
    do {
      if (ready()) {
        got = true;
        break;
      }
      Relax();
    } while (std::chrono::steady_clock::now() < until);
    Done(got);
    return got;
  }

 private:
  // Whether this wait may spin; if so, a slot is taken.
  bool Admit();
  // Releases the slot, counts the outcome and moves the credits.
  void Done(bool hit);
  static void Relax();

  const std::chrono::microseconds budget_;
  Slots* const slots_;
  int credits_ = kMaxCredits;
  int skipped_ = 0;
};

}  // namespace thindisk::nbd
